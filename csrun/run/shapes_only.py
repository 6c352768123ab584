"""``run.py ... --compile_only`` (or ``--validate_only``) on torch's meta device: a compile in seconds.

A compile needs shapes and dtypes, not weights or data. A model's ``run.py`` that gives
:func:`compile_shapes_only` its ``meta_batch`` (one batch of meta tensors with an input
section's shapes) compiles this way whenever ``--compile_only`` or ``--validate_only`` is on the
command line (or the explicit ``--shapes_only``, :func:`extra_args`): the model is built under
``torch.device("meta")`` (parameters without storage) and :func:`csrun.compiler.compile_only`
(or ``validate_only``) is called directly. ``torch.export`` traces meta tensors as it traces
fake ones, and the checks, the placement in the run's execution strategy and the compile
directory are those of a normal compile (``program.pt2`` keeps shape-only weight placeholders
either way); the user's Python forward, which a normal compile runs once on the CPU for the
step's shapes, is not run on real tensors. No data is read and no weight is allocated. Under
``csrun_wse`` only the chief compiles; a streamer, with nothing to stream, exits 0.

Every run.py flag and params key applies as usual (``--execution_strategy``,
``CSRUN_EXECUTION_STRATEGY`` from ``python-ws``, ``-o``, ``--compile_dir``); ``--shapes_only``
without ``--compile_only`` or ``--validate_only`` is refused (meta tensors hold no values to
train on). Exit codes: 0 compiled, 1 compile failed, 2 bad flags or params.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

import torch

from csrun.cluster import cluster_info
from csrun.compiler import compile_only, exit_code, validate_only
from csrun.consoles import console as log_console
from csrun.errors import UserError
from csrun.run import cli_args
from csrun.run.runner import compile_settings
from csrun.typed_config import ConfigError

FLAG = "--shapes_only"
"""The flag (a model's run.py flag, see :func:`extra_args`)."""


class ShapesOnlyNeedsCompile(ConfigError):
    """``--shapes_only`` without ``--compile_only`` / ``--validate_only``."""


def extra_args() -> argparse.ArgumentParser:
    """The run.py flag ``--shapes_only`` (the runner's ``extra_args_parser_fn``)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(FLAG, action="store_true", default=False,
                   help="with --compile_only/--validate_only: compile on torch's meta device (shapes only, "
                        "no weights, no data), in seconds")
    return p


COMPILE_FLAGS = ("--compile_only", "--validate_only")
"""A compile needs shapes, not weights: these flags take the shapes-only path by themselves."""


def wanted(argv: list[str]) -> bool:
    """True when the command line asks for a compile (``--shapes_only``, ``--compile_only``, ``--validate_only``)."""
    return FLAG in argv or any(a in COMPILE_FLAGS for a in argv)


def compile_shapes_only(argv: list[str], *, model_fn: Any, model_config: type, input_config: type,
                        meta_batch: Callable[[Any], Any], prog: str = "run.py") -> int:
    """Parse run.py's ``argv`` and compile (or validate) on meta tensors, ``meta_batch(section)`` being
    one batch of the input section's shapes; the exit status (module docstring)."""
    if not cluster_info().is_chief:
        return 0  # a streamer of a compile-only job: nothing to stream
    try:
        args = cli_args.parse_args(argv, prog=prog, parents=[extra_args()])
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 2
    try:
        params = cli_args.load_params(args, model_config=model_config, input_config=input_config, meta=True)
        rc = params.runconfig
        if not (rc.compile_only or rc.validate_only):
            raise ShapesOnlyNeedsCompile(f"{FLAG}: meta tensors have no values to train on",
                                         fix="add --compile_only (or --validate_only), or drop --shapes_only")
        mode = "eval" if rc.mode in ("eval", "eval_all") else rc.mode
        settings = compile_settings(params, mode=mode)
        section = params.eval_input if mode == "eval" else params.train_input
        with torch.device("meta"):
            model = model_fn(params)
        model.train(mode != "eval")
        console = log_console(highlight=False)
        if rc.validate_only:
            result = validate_only(model, meta_batch(section), settings=settings, console=console)
        else:
            result = compile_only(model, meta_batch(section), settings=settings, model_dir=rc.model_dir,
                                  compile_dir=rc.compile_dir, console=console)
        return exit_code(result)
    except UserError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
