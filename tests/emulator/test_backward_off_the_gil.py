"""The engine's backward pass runs to its end while another thread of the process holds the GIL.

The embedded engine shares the chief's interpreter. A backward that frees each saved tensor
as it goes needs the GIL for every one that was ever a Python object (torch keeps such a
tensor's Python object alive for it), so it stalls whenever the training loop runs Python
beside it: a closure every step made the engine wait ~0.4 ms a step for the loop
(BENCHMARKS.md). The engine keeps the step's graph through the backward and frees it
afterwards, with the GIL held.

The check, without a timing threshold: the engine thread hands out the step's outputs
(``publish``, just before the backward); the test thread then holds the GIL (a pure-Python
loop, with a switch interval long enough that the interpreter does not take it away) and
watches the weights' gradients appear. Every gradient must appear while it holds the GIL; a
backward that needs the GIL stops at its first freed tensor, before any gradient, and the
loop gives up after ``HOLD_S``.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import pytest
import torch

from csrun.compiler.spec import OptimizerSpec
from csrun.emulator.engine import Engine
from tests.emulator.helpers import MLP, make_program, mlp_batches, quiet

HOLD_S = 20.0
"""How long the test thread holds the GIL at most (a bound for the failing case only)."""


def _engine(precision: str, optimizer: str, monkeypatch: pytest.MonkeyPatch) -> tuple[Engine, Any]:
    monkeypatch.setenv("CSRUN_HALF_EMULATION", "rounding")
    batch = mlp_batches(1)[0]
    torch.manual_seed(0)
    hp = {"momentum": 0.9} if optimizer == "sgd" else {}
    program, spec = make_program(MLP(), batch, precision=precision, optimizer=OptimizerSpec(type=optimizer, hyperparameters=hp))
    return Engine(program, spec, notice=quiet), batch


@pytest.mark.parametrize("precision", ["float32", "float16"])
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_the_backward_finishes_while_another_thread_holds_the_gil(precision: str, optimizer: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    engine, batch = _engine(precision, optimizer, monkeypatch)
    engine.run_step(batch)  # the first step builds the traced forward
    holders = engine.half_weights.leaves if engine.half_weights is not None else engine.params
    published = threading.Event()
    failure: list[BaseException] = []

    def step() -> None:
        try:
            engine.run_step(batch, publish=lambda out: published.set())
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            failure.append(exc)
            published.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(HOLD_S * 2)  # the engine thread cannot force the GIL away from the loop below
    try:
        worker = threading.Thread(target=step)
        worker.start()
        published.wait()  # releases the GIL until the engine's forward is done
        deadline = time.monotonic() + HOLD_S
        seen = 0
        while time.monotonic() < deadline:  # pure Python: the GIL stays with this thread
            seen = sum(t.grad is not None for t in holders)
            if seen == len(holders):
                break
    finally:
        sys.setswitchinterval(interval)
    worker.join()
    assert not failure, failure
    assert seen == len(holders), f"only {seen} of {len(holders)} gradients appeared while this thread held the GIL"
