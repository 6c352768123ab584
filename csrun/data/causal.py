"""GPT-style causal LM samples: documents packed back to back into fixed windows.

The documents' tokens are joined into one stream with ``[SEP]`` after each document (the
end-of-text marker). The stream is cut into windows of ``max_seq_length + 1`` tokens that
overlap by one: ``input_ids`` = tokens ``0..L-1`` of a window, ``labels`` = tokens ``1..L``
(the next token at every position). The last window may be short: it is padded with
``[PAD]`` and ``attention_mask`` is 0 there (``attention_mask`` is 1 exactly where
``labels`` holds a real token, so it doubles as the loss weight). A final window with no
label at all is dropped. No randomness: the samples follow the text.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np


def causal_lm_samples(documents: Sequence[Sequence[Sequence[int]]], *, max_seq_length: int,
                      sep_id: int, pad_id: int) -> Iterator[dict[str, np.ndarray]]:
    """The windows of the packed token stream of ``documents`` (see the module doc)."""
    L = max_seq_length
    buffer: list[int] = []
    for doc in documents:
        for sentence in doc:
            buffer.extend(sentence)
        buffer.append(sep_id)
        while len(buffer) >= L + 1:
            yield _window(buffer[:L + 1], L, pad_id)
            del buffer[:L]
    if len(buffer) >= 2:
        yield _window(buffer, L, pad_id)


def _window(tokens: list[int], L: int, pad_id: int) -> dict[str, np.ndarray]:
    n = len(tokens) - 1  # positions with a real next token
    sample = {"input_ids": np.full(L, pad_id, np.int32), "attention_mask": np.zeros(L, np.int32),
              "labels": np.full(L, pad_id, np.int32)}
    sample["input_ids"][:n] = tokens[:n]
    sample["labels"][:n] = tokens[1:n + 1]
    sample["attention_mask"][:n] = 1
    return sample
