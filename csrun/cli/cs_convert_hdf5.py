"""cs_convert_hdf5 — turn text into tokenized HDF5 shards for the HDF5 input processors.

Usage::

    cs_convert_hdf5 --input 'corpus/*.txt' --output_dir data/bert_msl128 \\
        --format mlm_nsp --max_seq_length 128 --max_predictions_per_seq 20 \\
        --vocab_file vocab.txt
    cs_convert_hdf5 --input wiki.txt --output_dir data/gpt --format causal_lm \\
        --max_seq_length 256 --vocab_size 8000          # trains a WordPiece vocabulary

Input format (BERT's ``create_pretraining_data``): UTF-8 text files, one sentence per line,
documents separated by blank lines (the end of a file ends a document too).

Flags (``--flag value`` or ``--flag=value``):

``--input FILE|GLOB ...``      text files or globs (quote globs); repeatable; required.
``--output_dir DIR``           where the data set goes; required. Created if missing; must be
                               empty unless ``--overwrite``.
``--format mlm_nsp|causal_lm`` ``mlm_nsp`` (default): BERT masked-LM + next-sentence samples,
                               masked once here (static masking, reproducible from ``--seed``).
                               ``causal_lm``: documents packed into windows, ``labels`` = inputs
                               shifted by one.
``--max_seq_length N``         tokens per sample, specials included (default 128; at least 5
                               for mlm_nsp, 2 for causal_lm).
``--max_predictions_per_seq N`` masked positions per sample (mlm_nsp; default 20; at most
                               max_seq_length - 3).
``--masked_lm_prob P``         fraction of tokens masked, in (0, 1] (mlm_nsp; default 0.15).
``--short_seq_prob P``         probability of a shorter sample, in [0, 1] (mlm_nsp; default 0.1).
``--dupe_factor N``            passes over the input, each masked and paired differently
                               (mlm_nsp; default 1).
``--samples_per_shard N``      samples per ``shard_NNNNN.h5`` (default 1024; the last shard may
                               hold fewer).
``--vocab_file FILE``          a BERT WordPiece ``vocab.txt`` (must hold [PAD] [UNK] [CLS] [SEP]
                               [MASK]); copied into the output. Without it a WordPiece
                               vocabulary is trained on the input (HuggingFace ``tokenizers``)
                               and saved as ``vocab.txt``.
``--vocab_size N``             largest trained vocabulary (default 30522; at least 16); the
                               actual size is in metadata.json — use it as the model's vocab_size.
``--min_frequency N``          fewest occurrences for a trained merge (default 1).
``--lowercase / --no-lowercase`` lowercase and strip accents, as uncased BERT (default on).
``--seed N``                   seed of sentence pairs and masks (default 12345).
``--overwrite``                replace the data set in a non-empty ``--output_dir``.
``--quiet``                    print nothing but errors.

Output: ``shard_00000.h5``, ... (one HDF5 dataset per field; token ids int32), ``vocab.txt``,
and ``metadata.json`` (format, sizes, vocab size and special token ids, tokenizer, seed,
samples per shard and in total, the shard list, csrun version) — fields and layout in
:mod:`csrun.data.formats`. Everything is written to a hidden staging folder and moved into
place only when complete, ``metadata.json`` last; a failed run leaves nothing behind and an
existing data set untouched.

Reads no environment variables. Exit codes: 0 done; 2 bad flag or input (missing file, glob
matching nothing, no text, max_seq_length too small, output dir not empty, bad vocab file),
printed as ``cs_convert_hdf5: error: ...`` naming the value, without a traceback; 130 when
interrupted.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn

import csrun
from csrun.cli.common import console_entry, run_cli, say
from csrun.data.convert import ConvertConfig, convert
from csrun.data.formats import FORMATS
from csrun.errors import UsageError

PROG = "cs_convert_hdf5"


class _Parser(argparse.ArgumentParser):
    """argparse that raises :class:`UsageError` instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def _parser() -> argparse.ArgumentParser:
    defaults = ConvertConfig(inputs=(), output_dir=Path("."))
    p = _Parser(prog=PROG, description="Turn text into tokenized HDF5 shards (see the module manual).")
    p.add_argument("--input", dest="inputs", action="extend", nargs="+", required=True,
                   metavar="FILE_OR_GLOB", help="text files or globs; repeatable")
    p.add_argument("--output_dir", required=True, type=Path, help="where the data set goes")
    p.add_argument("--format", choices=list(FORMATS), default=defaults.format)
    p.add_argument("--max_seq_length", type=int, default=defaults.max_seq_length)
    p.add_argument("--max_predictions_per_seq", type=int, default=defaults.max_predictions_per_seq)
    p.add_argument("--masked_lm_prob", type=float, default=defaults.masked_lm_prob)
    p.add_argument("--short_seq_prob", type=float, default=defaults.short_seq_prob)
    p.add_argument("--dupe_factor", type=int, default=defaults.dupe_factor)
    p.add_argument("--samples_per_shard", type=int, default=defaults.samples_per_shard)
    p.add_argument("--vocab_file", type=Path, default=None)
    p.add_argument("--vocab_size", type=int, default=defaults.vocab_size)
    p.add_argument("--min_frequency", type=int, default=defaults.min_frequency)
    p.add_argument("--lowercase", action=argparse.BooleanOptionalAction, default=defaults.lowercase)
    p.add_argument("--version", action="version", version=f"{PROG} (csrun {csrun.__version__})",
                   help="print the version and exit")
    p.add_argument("--seed", type=int, default=defaults.seed)
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--quiet", action="store_true")
    return p


def _body(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(__doc__)
        return 0
    args = _parser().parse_args(argv)
    config = ConvertConfig(inputs=tuple(args.inputs), output_dir=args.output_dir, format=args.format,
                           max_seq_length=args.max_seq_length,
                           max_predictions_per_seq=args.max_predictions_per_seq,
                           masked_lm_prob=args.masked_lm_prob, short_seq_prob=args.short_seq_prob,
                           dupe_factor=args.dupe_factor, samples_per_shard=args.samples_per_shard,
                           vocab_file=args.vocab_file, vocab_size=args.vocab_size,
                           min_frequency=args.min_frequency, lowercase=args.lowercase, seed=args.seed,
                           overwrite=args.overwrite)
    log = (lambda line: None) if args.quiet else (lambda line: say(f"{PROG}: {line}"))
    convert(config, log=log)
    return 0


def main(argv: list[str] | None = None) -> int:
    """cs_convert_hdf5's entry point; returns the exit code."""
    return run_cli(PROG, _body, argv)


console_main = console_entry(main)


if __name__ == "__main__":
    console_main()
