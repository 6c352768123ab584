"""BERT pretraining samples (masked LM + next-sentence prediction), masked once, statically.

Masking is done here, in the converter, as the legacy TF-records/HDF5 pipelines did: the
masks are part of the data, reproducible from ``--seed``, identical on every streamer and in
every epoch (``--dupe_factor N`` makes N differently masked copies). The algorithm follows
the procedure described for BERT's ``create_pretraining_data``:

1. Per document, gather sentences until a target length is reached (``max_seq_length - 3``,
   or with probability ``short_seq_prob`` a random shorter one, at least 2).
2. Split the gathered sentences at a random point: A = the first part. With probability 0.5
   (always when only one sentence was gathered) B is a random stretch of another document and
   the label is 1 ("random"); the sentences not used go back to the document. Otherwise B is
   the rest of the gathered sentences and the label is 0 ("is next").
3. Trim the longer of A and B, from the front or the back at random, until
   ``[CLS] A [SEP] B [SEP]`` fits ``max_seq_length``.
4. Choose ``min(max_predictions_per_seq, max(1, round(len * masked_lm_prob)))`` positions that
   are not ``[CLS]``/``[SEP]``; at each, with probability 0.8 put ``[MASK]``, 0.1 keep the
   token, 0.1 put a random non-special token. The positions (ascending) and original ids are
   the labels.

All randomness comes from one :class:`random.Random` seeded with ``--seed``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

Document = Sequence[Sequence[int]]
"""A document: its sentences as token id lists."""


@dataclass(frozen=True, kw_only=True)
class MlmSettings:
    """How MLM+NSP samples are cut and masked."""

    max_seq_length: int
    """Tokens per sample, specials included."""
    max_predictions_per_seq: int
    """Most masked positions per sample."""
    masked_lm_prob: float
    """Fraction of a sample's tokens to mask."""
    short_seq_prob: float
    """Probability of a shorter target length."""
    dupe_factor: int
    """Passes over the documents."""
    vocab_size: int
    """Tokens in the vocabulary (random replacements are drawn from it)."""
    pad_id: int
    """``[PAD]``'s id."""
    cls_id: int
    """``[CLS]``'s id."""
    sep_id: int
    """``[SEP]``'s id."""
    mask_id: int
    """``[MASK]``'s id."""
    special_ids: frozenset[int]
    """Ids never drawn as random replacements."""


def mlm_nsp_samples(documents: Sequence[Document], settings: MlmSettings,
                    rng: random.Random) -> Iterator[dict[str, np.ndarray]]:
    """Every sample of ``dupe_factor`` passes over ``documents`` (needs at least two documents)."""
    for _ in range(settings.dupe_factor):
        for index in range(len(documents)):
            yield from _document_samples(documents, index, settings, rng)


def _document_samples(documents: Sequence[Document], index: int, s: MlmSettings,
                      rng: random.Random) -> Iterator[dict[str, np.ndarray]]:
    doc = documents[index]
    max_tokens = s.max_seq_length - 3
    target = max_tokens if rng.random() >= s.short_seq_prob else rng.randint(2, max_tokens)
    chunk: list[Sequence[int]] = []
    length = 0
    i = 0
    while i < len(doc):
        chunk.append(doc[i])
        length += len(doc[i])
        if i == len(doc) - 1 or length >= target:
            a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
            tokens_a = [t for seg in chunk[:a_end] for t in seg]
            if len(chunk) == 1 or rng.random() < 0.5:
                is_random = 1
                tokens_b = _random_stretch(documents, index, max(1, target - len(tokens_a)), rng)
                i -= len(chunk) - a_end  # the unused sentences go back
            else:
                is_random = 0
                tokens_b = [t for seg in chunk[a_end:] for t in seg]
            _truncate_pair(tokens_a, tokens_b, max_tokens, rng)
            if tokens_a and tokens_b:
                yield _masked_sample(tokens_a, tokens_b, is_random, s, rng)
            chunk, length = [], 0
        i += 1


def _random_stretch(documents: Sequence[Document], avoid: int, want: int, rng: random.Random) -> list[int]:
    other = rng.randrange(len(documents) - 1)
    other += other >= avoid  # any document but this one
    doc = documents[other]
    tokens: list[int] = []
    for seg in doc[rng.randrange(len(doc)):]:
        tokens.extend(seg)
        if len(tokens) >= want:
            break
    return tokens


def _truncate_pair(a: list[int], b: list[int], max_tokens: int, rng: random.Random) -> None:
    while len(a) + len(b) > max_tokens:
        longer = a if len(a) > len(b) else b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


def _masked_sample(a: list[int], b: list[int], is_random: int, s: MlmSettings,
                   rng: random.Random) -> dict[str, np.ndarray]:
    tokens = [s.cls_id, *a, s.sep_id, *b, s.sep_id]
    segments = [0] * (len(a) + 2) + [1] * (len(b) + 1)
    candidates = [p for p, t in enumerate(tokens) if p != 0 and p != len(a) + 1 and p != len(tokens) - 1]
    rng.shuffle(candidates)
    count = min(s.max_predictions_per_seq, max(1, int(round(len(tokens) * s.masked_lm_prob))),
                len(candidates))
    positions = sorted(candidates[:count])
    masked = list(tokens)
    for p in positions:
        r = rng.random()
        if r < 0.8:
            masked[p] = s.mask_id
        elif r >= 0.9:
            masked[p] = _random_token(s, rng)
    L, P = s.max_seq_length, s.max_predictions_per_seq
    sample: dict[str, np.ndarray] = {
        "input_ids": np.full(L, s.pad_id, np.int32),
        "attention_mask": np.zeros(L, np.int32),
        "token_type_ids": np.zeros(L, np.int32),
        "masked_lm_positions": np.zeros(P, np.int32),
        "masked_lm_ids": np.zeros(P, np.int32),
        "masked_lm_weights": np.zeros(P, np.float32),
        "next_sentence_label": np.asarray(is_random, dtype=np.int32),
    }
    n = len(tokens)
    sample["input_ids"][:n] = masked
    sample["attention_mask"][:n] = 1
    sample["token_type_ids"][:n] = segments
    sample["masked_lm_positions"][:count] = positions
    sample["masked_lm_ids"][:count] = [tokens[p] for p in positions]
    sample["masked_lm_weights"][:count] = 1.0
    return sample


def _random_token(s: MlmSettings, rng: random.Random) -> int:
    while True:
        t = rng.randrange(s.vocab_size)
        if t not in s.special_ids:
            return t
