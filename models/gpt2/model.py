"""GPT-2 causal language model, in plain torch.

Token + learned position embeddings with dropout; ``num_hidden_layers`` pre-LN decoder blocks
(causal multi-head self-attention via ``scaled_dot_product_attention(is_causal=True)``, then a
``filter_size`` feed-forward network, each with a residual); a final LayerNorm; the LM head
tied to the token embeddings (``share_embedding_weights``). The config keeps the legacy
model-zoo key names (``filter_size``, ``num_heads``, ``nonlinearity``, ``loss_scaling``, ...).

``forward(batch)`` takes one ``causal_lm`` HDF5 batch (:mod:`csrun.data.formats`: ``labels``
are the inputs shifted left by one, ``attention_mask`` is 1 exactly where a label is real)
and returns scalars only: ``loss`` first, then ``lm_xent`` / ``lm_count`` / ``lm_correct``
for the eval metrics (:func:`gpt2_eval_metrics`). Static shapes, no Python control flow on
tensor values: the step captures with ``torch.export`` (``csrun.compiler``).

GPT-3 is this architecture at other sizes (``configs/gpt3_xl.yaml``: 1.3B; ``gpt3_debug.yaml``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from csrun.run.model_size import MAX_LAYERS, linear_parameters, transformer_layer_parameters
from csrun.run.params import ModelConfig, doc
from csrun.typed_config import ConfigError, check_fields

ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "gelu": nn.GELU, "gelu_new": lambda: nn.GELU(approximate="tanh"), "relu": nn.ReLU, "silu": nn.SiLU,
}


@dataclass(kw_only=True)
class Gpt2Config(ModelConfig):
    """``model`` for GPT-2 (legacy model-zoo names; GPT-2 small by default)."""

    vocab_size: int = doc(50257, "tokens in the vocabulary (at least the data's vocab_size)", min=1, max=2**31 - 1)
    hidden_size: int = doc(768, "width of the embeddings and decoder", min=1)
    num_hidden_layers: int = doc(12, "decoder blocks", min=1, max=MAX_LAYERS)
    num_heads: int = doc(12, "attention heads (must divide hidden_size)", min=1)
    filter_size: int = doc(3072, "width of the feed-forward network", min=1)
    nonlinearity: Literal["gelu", "gelu_new", "relu", "silu"] = doc("gelu", "activation of the feed-forward network")
    max_position_embeddings: int = doc(1024, "learned positions, GPT-2's n_positions (at least the sequence length)", min=1)
    position_embedding_type: Literal["learned"] = doc("learned", "learned absolute positions (the only kind here)")
    dropout_rate: float = doc(0.1, "dropout on residual branches", min=0, below=1)
    embedding_dropout_rate: float | None = doc(None, "dropout after the embeddings (default: dropout_rate)", min=0,
                                               below=1)
    attention_dropout_rate: float = doc(0.1, "dropout on the attention probabilities", min=0, below=1)
    layer_norm_epsilon: float = doc(1e-5, "LayerNorm epsilon", above=0)
    initializer_range: float = doc(0.02, "standard deviation of the normal weight init", above=0)
    share_embedding_weights: bool = doc(True, "tie the LM head to the token embeddings")
    use_bias_in_output: bool = doc(False, "a bias on the LM head")
    loss_scaling: Literal["num_tokens", "batch_size"] = doc(
        "num_tokens", "divide the summed token loss by the real tokens in the batch, or by batch_size")
    loss_weight: float = doc(1.0, "factor on the loss", above=0)

    def __post_init__(self) -> None:
        check_fields(self, "model")
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"model.num_heads: {self.num_heads} does not divide hidden_size {self.hidden_size}")

    def parameter_count(self) -> int:
        """Embeddings, blocks, final LayerNorm and an untied head, from the keys alone."""
        h, v = self.hidden_size, self.vocab_size
        count = (v + self.max_position_embeddings) * h + 2 * h
        count += self.num_hidden_layers * transformer_layer_parameters(h, self.filter_size)
        head = linear_parameters(h, v, bias=self.use_bias_in_output)
        return count + (head - v * h if self.share_embedding_weights else head)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention (SDPA, ``is_causal=True``)."""

    def __init__(self, cfg: Gpt2Config) -> None:
        super().__init__()
        self.heads = cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.attention_dropout = cfg.attention_dropout_rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        p = self.attention_dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, s, h))


class DecoderBlock(nn.Module):
    """Pre-LN block: x += attn(LN(x)); x += ffn(LN(x))."""

    def __init__(self, cfg: Gpt2Config) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_epsilon)
        self.attn = CausalSelfAttention(cfg)
        self.ffn_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_epsilon)
        self.ffn = nn.Sequential(nn.Linear(cfg.hidden_size, cfg.filter_size), ACTIVATIONS[cfg.nonlinearity](),
                                 nn.Linear(cfg.filter_size, cfg.hidden_size))
        self.dropout = nn.Dropout(cfg.dropout_rate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.attn_norm(x)))
        return x + self.dropout(self.ffn(self.ffn_norm(x)))


class Gpt2LMHeadModel(nn.Module):
    """GPT-2 with a (tied) LM head; ``forward(batch)`` -> dict of scalars, ``loss`` first."""

    def __init__(self, cfg: Gpt2Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.wpe = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        emb_dropout = cfg.dropout_rate if cfg.embedding_dropout_rate is None else cfg.embedding_dropout_rate
        self.embedding_dropout = nn.Dropout(emb_dropout)
        self.blocks = nn.ModuleList(DecoderBlock(cfg) for _ in range(cfg.num_hidden_layers))
        self.final_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_epsilon)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=cfg.use_bias_in_output)
        self.apply(self._init_weights)
        # GPT-2: residual output projections scaled by 1/sqrt(2 * layers)
        for block in self.blocks:
            for proj in (block.attn.proj, block.ffn[2]):
                nn.init.normal_(proj.weight, std=cfg.initializer_range / math.sqrt(2 * cfg.num_hidden_layers))
        if cfg.share_embedding_weights:
            self.lm_head.weight = self.wte.weight

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=self.cfg.initializer_range)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Next-token logits [B, S, V] for ids [B, S]."""
        if input_ids.shape[1] > self.cfg.max_position_embeddings:
            raise ValueError(f"sequence length {input_ids.shape[1]} is more than max_position_embeddings "
                             f"{self.cfg.max_position_embeddings}")
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.embedding_dropout(self.wte(input_ids) + self.wpe(positions)[None])
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.final_norm(x))

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Loss and metric sums for one ``causal_lm`` batch (int32 or int64 ids)."""
        input_ids = batch["input_ids"].long()
        labels = batch["labels"].long()
        weights = batch["attention_mask"].float()
        logits = self.logits(input_ids)
        token_loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view_as(weights)
        lm_xent = (token_loss * weights).sum()
        lm_count = weights.sum()
        lm_loss = lm_xent / lm_count.clamp_min(1.0)
        scaled = lm_loss if self.cfg.loss_scaling == "num_tokens" else lm_xent / input_ids.shape[0]
        lm_correct = ((logits.argmax(-1) == labels).float() * weights).sum()
        return {"loss": self.cfg.loss_weight * scaled, "lm_loss": lm_loss.detach(), "lm_xent": lm_xent.detach(),
                "lm_correct": lm_correct, "lm_count": lm_count}


def gpt2_model(params: object) -> Gpt2LMHeadModel:
    """The runner's ``model_fn``: the model from ``params.model`` (a :class:`Gpt2Config`)."""
    cfg = params.model  # type: ignore[attr-defined]
    if not isinstance(cfg, Gpt2Config):
        raise TypeError(f"params.model must be a Gpt2Config, got {type(cfg).__name__}")
    return Gpt2LMHeadModel(cfg)


def gpt2_eval_metrics(means: dict[str, float]) -> dict[str, float]:
    """Eval metrics from the per-batch means of the outputs (ratios of means = ratios of sums)."""
    count = max(means["lm_count"], 1e-12)
    return {"accuracy": means["lm_correct"] / count,
            "perplexity": math.exp(min(means["lm_xent"] / count, 700.0))}
