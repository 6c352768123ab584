"""The engine's backward pass runs to its end while another thread of the process holds the GIL.

The embedded engine shares the chief's interpreter. A backward that frees each saved tensor
as it goes needs the GIL for every one that was ever a Python object (torch keeps such a
tensor's Python object alive for it), so it stalls whenever the training loop runs Python
beside it: a closure every step made the engine wait ~0.4 ms a step for the loop
(BENCHMARKS.md). The engine keeps the step's graph through the backward and frees it
afterwards, with the GIL held.

The check, without a timing threshold: the engine thread hands out the step's outputs
(``publish``, just before the backward); the test thread then takes the GIL and holds it (a
pure-Python loop, with a switch interval long enough that the interpreter does not take it
away) while it watches the weights' gradients. A backward that needs the GIL stops at its first
freed tensor, before any gradient, and cannot finish the step: the loop gives up after
``HOLD_S``. A backward that does not need it sets every gradient, then waits for the GIL to
go on. A step that ended before the test thread got the GIL (it had the GIL back only after
the step) shows nothing either way, and the test runs another (up to ``ATTEMPTS``).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import pytest
import torch

from csrun.emulator.engine.executor import Engine
from tests.emulator.helpers import make_engine
from tests.tiny_models import MLP, mlp_batches

HOLD_S = 20.0
"""How long the test thread holds the GIL at most (a bound for the failing case only)."""
ATTEMPTS = 20
"""Steps tried at most for one that was still running when the test thread took the GIL."""


def _hold_the_gil_during_a_step(engine: Engine, batch: Any) -> str:
    """Run a step on a thread and hold the GIL from its hand-out on: ``"all"`` (every gradient
    appeared meanwhile), ``"stuck"`` (the step neither set them nor ended) or ``"ended"``."""
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
        outcome = "stuck"
        while time.monotonic() < deadline:  # pure Python: the GIL stays with this thread
            if all(t.grad is not None for t in holders):
                outcome = "all"
                break
            if not worker.is_alive():
                outcome = "ended"
                break
    finally:
        sys.setswitchinterval(interval)
    worker.join()
    assert not failure, failure
    return outcome


@pytest.mark.parametrize("precision", ["float32", "float16"])
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_the_backward_finishes_while_another_thread_holds_the_gil(precision: str, optimizer: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CSRUN_HALF_EMULATION", "rounding")
    batch = mlp_batches(1)[0]
    torch.manual_seed(0)
    engine = make_engine(MLP(), batch, precision, {"momentum": 0.9} if optimizer == "sgd" else {}, optimizer=optimizer)
    engine.run_step(batch)  # the first step builds the traced forward
    outcomes = []
    while len(outcomes) < ATTEMPTS and (not outcomes or outcomes[-1] == "ended"):
        outcomes.append(_hold_the_gil_during_a_step(engine, batch))
    assert outcomes[-1] == "all", f"steps: {outcomes} (stuck: the backward waited for the GIL before its gradients)"
