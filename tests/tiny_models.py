"""The tiny models the tests share, one copy each, with the batches that fit them.

Copies that differed only in numbers are one class here with those numbers as arguments (sizes,
and ``seed`` for a model that seeds torch itself before making its layers). A model stays in its
test module only when it is shaped for that test's one behaviour, and its docstring says so.

(Not ``tests/models.py``: ``tests/models/`` is the package of the model zoo's tests.)
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# classifiers on a (x, y) batch, forward returns the loss -----------------------------------------


class MLP(nn.Module):
    """A one-hidden-layer classifier: forward((x, y)) returns the cross-entropy loss.

    The emulator's tests use the defaults (:func:`mlp_batches` fits them); the device tests use
    (6, 16, 3); ``activation`` is ``"tanh"`` or ``"relu"``.
    """

    def __init__(self, d_in: int = 12, hidden: int = 24, classes: int = 5, *, activation: str = "tanh") -> None:
        super().__init__()
        if activation not in ("tanh", "relu"):
            raise ValueError(f"activation {activation!r}: tanh or relu")
        self.activation = activation
        self.l1 = nn.Linear(d_in, hidden)
        self.l2 = nn.Linear(hidden, classes)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        h = self.l1(x)
        h = torch.tanh(h) if self.activation == "tanh" else torch.relu(h)
        return F.cross_entropy(self.l2(h), y)


def mlp_batches(n: int, *, seed: int = 0, bs: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` random classification batches for the default :class:`MLP`."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(bs, 12, generator=g), torch.randint(0, 5, (bs,), generator=g)) for _ in range(n)]


class SharedWeightMLP(MLP):
    """The default MLP with ReLU whose first layer's weight is also read by a float32 op (a sum of
    squares) beside its 16-bit matmul. Shaped for the float16 emulation's tests: a weight that
    16-bit and float32 ops both read."""

    def __init__(self) -> None:
        super().__init__(activation="relu")

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        penalty = (self.l1.weight.float() ** 2).sum() * 1e-3
        return F.cross_entropy(self.l2(torch.relu(self.l1(x))), y) + penalty


class LinearClassifier(nn.Module):
    """One linear layer (``fc``): forward((x, y)) returns the cross-entropy loss."""

    def __init__(self, d_in: int = 4, classes: int = 2, *, seed: int | None = None) -> None:
        super().__init__()
        if seed is not None:
            torch.manual_seed(seed)
        self.fc = nn.Linear(d_in, classes)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self.fc(x), y)


class DeepMLP(nn.Module):
    """fc_mnist-like: ``depth`` Linear+ReLU layers (``body``) and a ``head``; batch {"x", "y"} -> loss."""

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


# models whose loss is the loop's business -------------------------------------------------------


class Classifier(nn.Module):
    """fc1 -> [batch norm] -> ReLU -> fc2: forward(x) returns the logits (the loss is the loop's)."""

    def __init__(self, d_in: int = 6, hidden: int = 16, classes: int = 3, *, batch_norm: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.bn = nn.BatchNorm1d(hidden) if batch_norm else None
        self.fc2 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        if self.bn is not None:
            h = self.bn(h)
        return self.fc2(torch.relu(h))


class TwoHeads(nn.Module):
    """A shared body and two heads: forward(x) returns (class logits, a score per sample)."""

    def __init__(self, d_in: int = 6, hidden: int = 8, classes: int = 3, *, seed: int | None = None) -> None:
        super().__init__()
        if seed is not None:
            torch.manual_seed(seed)
        self.body = nn.Linear(d_in, hidden)
        self.cls = nn.Linear(hidden, classes)
        self.reg = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.body(x))
        return self.cls(h), self.reg(h).squeeze(-1)


@dataclasses.dataclass
class Output(OrderedDict):
    """Hugging Face's ModelOutput shape: a dataclass that is also an OrderedDict."""

    loss: Any = None
    logits: Any = None

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) is not None:
                self[f.name] = getattr(self, f.name)


class KeywordLM(nn.Module):
    """Called as model(input_ids=..., labels=...), returns Output(loss, logits); no labels, no loss."""

    def __init__(self, vocab: int = 11, d: int = 8, *, seed: int | None = None) -> None:
        super().__init__()
        if seed is not None:
            torch.manual_seed(seed)
        self.vocab = vocab
        self.emb = nn.Embedding(vocab, d)
        self.head = nn.Linear(d, vocab)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> Output:
        logits = self.head(self.emb(input_ids))
        loss = None if labels is None else F.cross_entropy(logits.reshape(-1, self.vocab), labels.reshape(-1))
        return Output(loss=loss, logits=logits)


# convolutions -------------------------------------------------------------------------------------


class ConvNet(nn.Module):
    """A tiny CNN on an (images, labels) tuple batch: {"loss", "logits"}."""

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


class DropoutConvNet(nn.Module):
    """Conv + batch norm (running statistics: buffer updates) + dropout (random draws) on 6x6
    images; forward((x, y)) returns the loss. Shaped for what a trace of the forward could get
    wrong (the emulator's traced forward and float16 probe tests); :func:`conv_batches` fits it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.3)
        self.head = nn.Linear(4 * 6 * 6, 3)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        h = self.drop(torch.relu(self.bn(self.conv(x))))
        return F.cross_entropy(self.head(h.flatten(1)), y)


def conv_batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` random batches for :class:`DropoutConvNet`."""
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(8, 1, 6, 6, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(n)]


# language models ------------------------------------------------------------------------------------


class TinyTransformer(nn.Module):
    """One encoder layer over token embeddings, masked-LM style loss; returns (loss, logits).
    :func:`lm_batches` fits the defaults."""

    def __init__(self, vocab: int = 32, d: int = 16, seq: int = 8) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.enc = nn.TransformerEncoderLayer(d, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.enc(self.emb(batch["input_ids"]) + self.pos)
        logits = self.head(self.norm(h))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1))
        return loss, logits


def lm_batches(n: int, *, seed: int = 0, bs: int = 4) -> list[dict[str, torch.Tensor]]:
    """``n`` random token batches (vocabulary 32, 8 tokens) for :class:`TinyTransformer`."""
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(0, 32, (bs, 8), generator=g),
             "labels": torch.randint(0, 32, (bs, 8), generator=g)} for _ in range(n)]


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
    """One pre-norm causal decoder block with SDPA (:class:`TinyGPT`'s)."""

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
