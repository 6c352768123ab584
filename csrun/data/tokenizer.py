"""BERT WordPiece tokenization with the HuggingFace ``tokenizers`` library.

Either loaded from a ``vocab.txt`` (:func:`load_wordpiece`) or trained on the input text
(:func:`train_wordpiece`, the library's WordPiece trainer). Both use BERT's normalizer and
pre-tokenizer (clean text, split on whitespace and punctuation, Chinese characters apart;
lowercasing and accent stripping when ``lowercase``). Special tokens are never added by the
tokenizer: the formats place ``[CLS]``/``[SEP]`` themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from csrun.data.errors import DataError
from csrun.data.formats import SPECIAL_TOKENS


def _library() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise DataError("the HuggingFace 'tokenizers' package is needed to convert text: "
                        "pip install tokenizers") from None
    return tokenizers


@dataclass(frozen=True, kw_only=True)
class WordPiece:
    """A ready BERT WordPiece tokenizer and what the metadata records about it."""

    tokenizer: Any
    """The ``tokenizers`` BertWordPieceTokenizer."""
    lowercase: bool
    """Whether text is lowercased (and accents stripped)."""
    trained: bool
    """True when trained on the input; False when loaded from a vocab file."""
    source_vocab: str | None
    """The vocab file it was loaded from, if any."""

    @property
    def vocab_size(self) -> int:
        """Tokens in the vocabulary."""
        return max(self.tokenizer.get_vocab().values()) + 1

    @property
    def special_ids(self) -> dict[str, int]:
        """Ids of the special tokens."""
        return {tok: int(self.tokenizer.token_to_id(tok)) for tok in SPECIAL_TOKENS}

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens."""
        return [e.ids for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def vocab_lines(self) -> list[str]:
        """The vocabulary, one token per id (what ``vocab.txt`` holds)."""
        by_id = {i: tok for tok, i in self.tokenizer.get_vocab().items()}
        return [by_id.get(i, f"[unused{i}]") for i in range(self.vocab_size)]

    def describe(self) -> dict[str, Any]:
        """The ``tokenizer`` entry of ``metadata.json``."""
        return {"library": "tokenizers", "library_version": _library().__version__,
                "type": "bert-wordpiece", "lowercase": self.lowercase, "trained": self.trained,
                "source_vocab": self.source_vocab}


def _check_specials(tokenizer: Any, where: str) -> None:
    missing = [tok for tok in SPECIAL_TOKENS if tokenizer.token_to_id(tok) is None]
    if missing:
        raise DataError(f"{where} lacks the special token(s) {', '.join(missing)}: a BERT vocab.txt "
                        f"must hold {', '.join(SPECIAL_TOKENS)}")


def load_wordpiece(vocab_file: Path, *, lowercase: bool) -> WordPiece:
    """A tokenizer from a WordPiece ``vocab.txt`` (one token per line, id = line number)."""
    lib = _library()
    if not vocab_file.is_file():
        raise DataError(f"--vocab_file {str(vocab_file)!r}: no such file")
    try:
        lines = vocab_file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"cannot read --vocab_file {str(vocab_file)!r}: {exc}") from None
    if not any(line.strip() for line in lines):
        raise DataError(f"--vocab_file {str(vocab_file)!r} is empty")
    missing = [tok for tok in SPECIAL_TOKENS if tok not in {line.strip() for line in lines}]
    if missing:
        raise DataError(f"--vocab_file {str(vocab_file)!r} lacks the special token(s) {', '.join(missing)}: "
                        f"a BERT vocab.txt must hold {', '.join(SPECIAL_TOKENS)}")
    try:
        tokenizer = lib.BertWordPieceTokenizer(str(vocab_file), lowercase=lowercase)
    except Exception as exc:  # the library raises plain Exception for a bad file
        raise DataError(f"--vocab_file {str(vocab_file)!r} is not a WordPiece vocabulary: {exc}") from None
    _check_specials(tokenizer, f"--vocab_file {str(vocab_file)!r}")
    return WordPiece(tokenizer=tokenizer, lowercase=lowercase, trained=False,
                     source_vocab=str(vocab_file.resolve()))


def train_wordpiece(files: Sequence[Path], *, vocab_size: int, lowercase: bool,
                    min_frequency: int = 1) -> WordPiece:
    """A tokenizer trained on ``files`` (WordPiece trainer, at most ``vocab_size`` tokens, specials first)."""
    lib = _library()
    tokenizer = lib.BertWordPieceTokenizer(lowercase=lowercase)
    tokenizer.train([str(f) for f in files], vocab_size=vocab_size, min_frequency=min_frequency,
                    special_tokens=list(SPECIAL_TOKENS), show_progress=False)
    _check_specials(tokenizer, "the trained vocabulary")
    return WordPiece(tokenizer=tokenizer, lowercase=lowercase, trained=True, source_vocab=None)
