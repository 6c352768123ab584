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

import csrun
from csrun.cli.common import console_entry, run_cli, say
from csrun.data.convert import ConvertConfig, convert
from csrun.data.formats import FORMATS
from csrun.help_style import Parser

PROG = "cs_convert_hdf5"
EPILOG = ("Output: shard_00000.h5, ..., vocab.txt and metadata.json, written to a hidden staging folder and moved\n"
          "into place only when complete. Exit codes: 0 done; 2 bad flag or input (naming the value); 130 interrupted.\n"
          "The manual: python -m pydoc csrun.cli.cs_convert_hdf5")


def _parser() -> argparse.ArgumentParser:
    defaults = ConvertConfig(inputs=(), output_dir=Path("."))
    p = Parser(PROG, "Turn text into tokenized HDF5 shards for the HDF5 input processors.",
               usage="--input FILE_OR_GLOB ... --output_dir DIR [options]", epilog=EPILOG)
    p.add_argument("--input", dest="inputs", action="extend", nargs="+", required=True,
                   metavar="FILE_OR_GLOB", help="text files or globs (quote globs); repeatable")
    p.add_argument("--output_dir", required=True, type=Path, metavar="DIR",
                   help="where the data set goes; created if missing, must be empty unless --overwrite")
    p.add_argument("--format", choices=list(FORMATS), default=defaults.format,
                   help="mlm_nsp: BERT masked-LM + next-sentence samples; causal_lm: packed windows, labels shifted by one")
    p.add_argument("--max_seq_length", type=int, default=defaults.max_seq_length, metavar="N",
                   help="tokens per sample, specials included (at least 5 for mlm_nsp, 2 for causal_lm)")
    p.add_argument("--max_predictions_per_seq", type=int, default=defaults.max_predictions_per_seq, metavar="N",
                   help="masked positions per sample (mlm_nsp; at most max_seq_length - 3)")
    p.add_argument("--masked_lm_prob", type=float, default=defaults.masked_lm_prob, metavar="P",
                   help="fraction of tokens masked, in (0, 1] (mlm_nsp)")
    p.add_argument("--short_seq_prob", type=float, default=defaults.short_seq_prob, metavar="P",
                   help="probability of a shorter sample, in [0, 1] (mlm_nsp)")
    p.add_argument("--dupe_factor", type=int, default=defaults.dupe_factor, metavar="N",
                   help="passes over the input, each masked and paired differently (mlm_nsp)")
    p.add_argument("--samples_per_shard", type=int, default=defaults.samples_per_shard, metavar="N",
                   help="samples per shard_NNNNN.h5 (the last may hold fewer)")
    p.add_argument("--vocab_file", type=Path, default=None, metavar="FILE",
                   help="a BERT WordPiece vocab.txt; without it one is trained on the input")
    p.add_argument("--vocab_size", type=int, default=defaults.vocab_size, metavar="N",
                   help="largest trained vocabulary (at least 16)")
    p.add_argument("--min_frequency", type=int, default=defaults.min_frequency, metavar="N",
                   help="fewest occurrences for a trained merge")
    p.add_argument("--lowercase", action=argparse.BooleanOptionalAction, default=defaults.lowercase,
                   help="lowercase and strip accents, as uncased BERT")
    p.add_argument("--seed", type=int, default=defaults.seed, metavar="N", help="seed of sentence pairs and masks")
    p.add_argument("--overwrite", action="store_true", help="replace the data set in a non-empty --output_dir")
    p.add_argument("--quiet", action="store_true", help="print nothing but errors")
    p.add_argument("--version", action="version", version=f"{PROG} (csrun {csrun.__version__})",
                   help="print the version and exit")
    return p


def _body(argv: list[str]) -> int:
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
