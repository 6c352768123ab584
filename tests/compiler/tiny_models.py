"""Small models the compiler tests capture: MLP, conv net, BERT-like encoder, GPT-like decoder."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    """fc_mnist-like: batch {"x", "y"} -> cross-entropy loss."""

    def __init__(self, d_in: int = 16, hidden: int = 32, depth: int = 2, classes: int = 4) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        d = d_in
        for _ in range(depth):
            layers += [nn.Linear(d, hidden), nn.ReLU()]
            d = hidden
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(d, classes)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.cross_entropy(self.head(self.body(batch["x"])), batch["y"])

    @staticmethod
    def batch(n: int = 8, d_in: int = 16, classes: int = 4) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        return {"x": torch.randn(n, d_in, generator=g), "y": torch.randint(0, classes, (n,), generator=g)}


class ConvNet(nn.Module):
    """A tiny CNN on a (images, labels) tuple batch."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 8, 3, stride=2, padding=1)
        self.fc = nn.Linear(8 * 4 * 4, 10)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        x, y = batch
        h = F.relu(self.bn(self.conv1(x)))
        h = F.relu(self.conv2(h)).flatten(1)
        logits = self.fc(h)
        return {"loss": F.cross_entropy(logits, y), "logits": logits}

    @staticmethod
    def batch(n: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)


class TinyBert(nn.Module):
    """BERT-like: embeddings + TransformerEncoder with a padding mask + MLM head (tied)."""

    def __init__(self, vocab: int = 64, hidden: int = 32, layers: int = 2, heads: int = 2, filt: int = 64,
                 msl: int = 16, dropout: float = 0.0) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(msl, hidden)
        self.norm = nn.LayerNorm(hidden)
        layer = nn.TransformerEncoderLayer(hidden, heads, filt, dropout=dropout, activation="gelu", batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.mlm = nn.Linear(hidden, vocab)
        self.mlm.weight = self.tok.weight

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
        pos = torch.arange(ids.shape[1], device=ids.device)
        h = self.norm(self.tok(ids) + self.pos(pos))
        h = self.encoder(h, src_key_padding_mask=mask == 0)
        logits = self.mlm(h)
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return {"loss": loss, "logits": logits}

    @staticmethod
    def batch(n: int = 4, msl: int = 16, vocab: int = 64) -> dict[str, torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, vocab, (n, msl), generator=g)
        mask = torch.ones(n, msl, dtype=torch.int64)
        mask[:, msl - 4:] = 0
        labels = torch.where(mask.bool(), ids, torch.full_like(ids, -100))
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}


class Block(nn.Module):
    """One pre-norm causal decoder block with SDPA."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """GPT-like causal LM on a (tokens,) batch: next-token loss."""

    def __init__(self, vocab: int = 64, hidden: int = 32, layers: int = 2, heads: int = 2, msl: int = 16) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = nn.Embedding(msl, hidden)
        self.blocks = nn.ModuleList([Block(hidden, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.wte(tokens[:, :-1]) + self.wpe(torch.arange(tokens.shape[1] - 1, device=tokens.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())

    @staticmethod
    def batch(n: int = 4, msl: int = 16, vocab: int = 64) -> torch.Tensor:
        return torch.randint(0, vocab, (n, msl + 1), generator=torch.Generator().manual_seed(0))
