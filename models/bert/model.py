"""BERT pretraining (masked LM + next-sentence prediction), in plain torch.

The architecture of the original BERT: word + position + token-type embeddings, LayerNorm and
dropout; ``num_hidden_layers`` post-LN encoder layers (multi-head self-attention with an
additive padding mask, then a ``filter_size`` feed-forward network); a tanh pooler on ``[CLS]``
for NSP; an MLM head (dense + nonlinearity + LayerNorm, then the word embeddings transposed
plus a bias) applied only at the masked positions, gathered with ``masked_lm_positions``.

The model config keeps the legacy model-zoo key names (``filter_size``, ``num_heads``,
``encoder_nonlinearity``, ``dropout_rate``, ...). ``forward(batch)`` takes one batch of the
``mlm_nsp`` HDF5 format (:mod:`csrun.data.formats`) and returns scalars only, ``loss`` first,
then the sums the eval metrics are made of (see :func:`bert_eval_metrics`). Everything has
static shapes and no Python control flow on tensor values, so the step captures with
``torch.export`` (``csrun.compiler``).
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

Nonlinearity = Literal["gelu", "relu", "silu", "gelu_new", "tanh"]
ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "gelu": nn.GELU, "gelu_new": lambda: nn.GELU(approximate="tanh"), "relu": nn.ReLU, "silu": nn.SiLU,
    "tanh": nn.Tanh,
}
MASK_VALUE = -10000.0
"""Added to the attention scores of padding keys (finite: safe in float16)."""


@dataclass(kw_only=True)
class BertConfig(ModelConfig):
    """``model`` for BERT pretraining (legacy model-zoo names)."""

    vocab_size: int = doc(30522, "tokens in the vocabulary (at least the data's vocab_size)", min=1, max=2**31 - 1)
    hidden_size: int = doc(768, "width of the embeddings and encoder", min=1)
    num_hidden_layers: int = doc(12, "encoder layers", min=1, max=MAX_LAYERS)
    num_heads: int = doc(12, "attention heads (must divide hidden_size)", min=1)
    filter_size: int = doc(3072, "width of the feed-forward network", min=1)
    encoder_nonlinearity: Nonlinearity = doc("gelu", "activation of the feed-forward network")
    pooler_nonlinearity: Nonlinearity = doc("tanh", "activation of the [CLS] pooler")
    mlm_nonlinearity: Nonlinearity = doc("gelu", "activation of the MLM head transform")
    dropout_rate: float = doc(0.1, "dropout on embeddings, attention output and feed-forward output", min=0, below=1)
    attention_dropout_rate: float = doc(0.1, "dropout on the attention probabilities", min=0, below=1)
    max_position_embeddings: int = doc(512, "learned positions (at least the sequence length)", min=1)
    num_segments: int = doc(2, "token types (sentence A / B)", min=1)
    layer_norm_epsilon: float = doc(1e-12, "LayerNorm epsilon", above=0)
    initializer_range: float = doc(0.02, "standard deviation of the normal weight init", above=0)
    share_embedding_weights: bool = doc(True, "tie the MLM output projection to the word embeddings")
    disable_nsp: bool = doc(False, "MLM only: no NSP head and no NSP loss")
    mlm_loss_weight: float = doc(1.0, "factor on the MLM term of the loss", above=0)
    mlm_loss_scaling: Literal["num_masked", "batch_size"] = doc(
        "num_masked", "divide the summed MLM loss by the masked tokens in the batch, or by batch_size "
        "(the legacy form, with mlm_loss_weight about 1 / masked tokens per sequence)")

    def __post_init__(self) -> None:
        check_fields(self, "model")
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"model.num_heads: {self.num_heads} does not divide hidden_size {self.hidden_size}")

    def parameter_count(self) -> int:
        """Embeddings, encoder layers, MLM head (its projection tied or not) and the NSP head, from the keys alone."""
        h, v = self.hidden_size, self.vocab_size
        count = (v + self.max_position_embeddings + self.num_segments) * h + 2 * h
        count += self.num_hidden_layers * transformer_layer_parameters(h, self.filter_size)
        count += linear_parameters(h, h) + 2 * h + linear_parameters(h, v) - (v * h if self.share_embedding_weights else 0)
        return count + (0 if self.disable_nsp else linear_parameters(h, h) + linear_parameters(h, 2))


class SelfAttention(nn.Module):
    """Multi-head self-attention with an additive mask, via scaled_dot_product_attention."""

    def __init__(self, hidden: int, heads: int, attention_dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.attention_dropout = attention_dropout

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None, *, causal: bool = False) -> torch.Tensor:
        """``x`` [B, S, H]; ``mask`` additive, broadcastable to [B, heads, S, S]."""
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        attn_mask = None if mask is None else mask.to(q.dtype)
        p = self.attention_dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p, is_causal=causal)
        return self.out(y.transpose(1, 2).reshape(b, s, h))


class EncoderLayer(nn.Module):
    """Post-LN transformer encoder layer: x = LN(x + attn(x)); x = LN(x + ffn(x))."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.attention = SelfAttention(cfg.hidden_size, cfg.num_heads, cfg.attention_dropout_rate)
        self.attention_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_epsilon)
        self.ffn = nn.Sequential(nn.Linear(cfg.hidden_size, cfg.filter_size), ACTIVATIONS[cfg.encoder_nonlinearity](),
                                 nn.Linear(cfg.filter_size, cfg.hidden_size))
        self.ffn_norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_epsilon)
        self.dropout = nn.Dropout(cfg.dropout_rate)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.attention_norm(x + self.dropout(self.attention(x, mask)))
        return self.ffn_norm(x + self.dropout(self.ffn(x)))


class BertEmbeddings(nn.Module):
    """Word + learned position + token-type embeddings, LayerNorm, dropout."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.word = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.position = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size)
        self.token_type = nn.Embedding(cfg.num_segments, cfg.hidden_size)
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_epsilon)
        self.dropout = nn.Dropout(cfg.dropout_rate)

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.word(input_ids) + self.position(positions)[None] + self.token_type(token_type_ids)
        return self.dropout(self.norm(x))


class MlmTransform(nn.Module):
    """The MLM head's transform before the output projection: dense, nonlinearity, LayerNorm."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(cfg.hidden_size, cfg.hidden_size)
        self.act = ACTIVATIONS[cfg.mlm_nonlinearity]()
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=cfg.layer_norm_epsilon)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.act(self.dense(x)))


class BertPretrainModel(nn.Module):
    """BERT with MLM and NSP heads; ``forward(batch)`` -> dict of scalars, ``loss`` first."""

    def __init__(self, cfg: BertConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embeddings = BertEmbeddings(cfg)
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.mlm_transform = MlmTransform(cfg)
        self.mlm_decoder = nn.Linear(cfg.hidden_size, cfg.vocab_size)
        if not cfg.disable_nsp:
            self.pooler = nn.Sequential(nn.Linear(cfg.hidden_size, cfg.hidden_size), ACTIVATIONS[cfg.pooler_nonlinearity]())
            self.nsp_head = nn.Linear(cfg.hidden_size, 2)
        self.apply(self._init_weights)
        if cfg.share_embedding_weights:
            self.mlm_decoder.weight = self.embeddings.word.weight

    def _init_weights(self, module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=self.cfg.initializer_range)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def encode(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Hidden states [B, S, H]; padding keys (attention_mask 0) get MASK_VALUE added."""
        if input_ids.shape[1] > self.cfg.max_position_embeddings:
            raise ValueError(f"sequence length {input_ids.shape[1]} is more than max_position_embeddings "
                             f"{self.cfg.max_position_embeddings}")
        x = self.embeddings(input_ids, token_type_ids)
        mask = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * MASK_VALUE
        for layer in self.layers:
            x = layer(x, mask)
        return x

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Loss and metric sums for one ``mlm_nsp`` batch (int32 or int64 ids)."""
        input_ids = batch["input_ids"].long()
        hidden = self.encode(input_ids, batch["token_type_ids"].long(), batch["attention_mask"])
        positions = batch["masked_lm_positions"].long()
        labels = batch["masked_lm_ids"].long()
        weights = batch["masked_lm_weights"].float()
        gathered = torch.gather(hidden, 1, positions[:, :, None].expand(-1, -1, hidden.shape[-1]))
        logits = self.mlm_decoder(self.mlm_transform(gathered))  # [B, P, V]
        token_loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view_as(weights)
        mlm_xent = (token_loss * weights).sum()
        mlm_count = weights.sum()
        mlm_loss = mlm_xent / mlm_count.clamp_min(1.0)
        scaled = mlm_loss if self.cfg.mlm_loss_scaling == "num_masked" else mlm_xent / input_ids.shape[0]
        loss = self.cfg.mlm_loss_weight * scaled
        mlm_correct = ((logits.argmax(-1) == labels).float() * weights).sum()
        out = {"loss": loss, "mlm_loss": mlm_loss.detach(), "mlm_xent": mlm_xent.detach(),
               "mlm_correct": mlm_correct, "mlm_count": mlm_count}
        if not self.cfg.disable_nsp:
            nsp_labels = batch["next_sentence_label"].long()
            nsp_logits = self.nsp_head(self.pooler(hidden[:, 0]))
            nsp_loss = F.cross_entropy(nsp_logits, nsp_labels)
            out["loss"] = loss + nsp_loss
            out["nsp_loss"] = nsp_loss.detach()
            out["nsp_correct"] = (nsp_logits.argmax(-1) == nsp_labels).float().sum()
            out["nsp_count"] = torch.ones_like(nsp_labels, dtype=torch.float32).sum()
        return out


def bert_model(params: object) -> BertPretrainModel:
    """The runner's ``model_fn``: the model from ``params.model`` (a :class:`BertConfig`)."""
    cfg = params.model  # type: ignore[attr-defined]
    if not isinstance(cfg, BertConfig):
        raise TypeError(f"params.model must be a BertConfig, got {type(cfg).__name__}")
    return BertPretrainModel(cfg)


def bert_eval_metrics(means: dict[str, float]) -> dict[str, float]:
    """Eval metrics from the per-batch means of the outputs (ratios of means = ratios of sums)."""
    metrics = {"mlm_accuracy": means["mlm_correct"] / max(means["mlm_count"], 1e-12),
               "mlm_perplexity": math.exp(min(means["mlm_xent"] / max(means["mlm_count"], 1e-12), 700.0))}
    if "nsp_correct" in means:
        metrics["nsp_accuracy"] = means["nsp_correct"] / max(means["nsp_count"], 1e-12)
    return metrics
