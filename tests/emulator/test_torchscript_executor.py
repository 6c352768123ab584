"""The engine's TorchScript (the forward's trace, the scripted SGD update) runs without the executor's
optimization passes from its first call on, and the caller's thread is left as it was."""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from csrun.emulator.engine import lean_step
from csrun.emulator.engine.torchscript import unoptimized
from csrun.emulator.engine.traced_forward import TracedForward
from tests.emulator.helpers import make_engine
from tests.tiny_models import MLP, mlp_batches


def _optimizing() -> bool:
    return bool(torch._C._get_graph_executor_optimize())


def test_unoptimized_switches_off_and_restores_even_on_an_error() -> None:
    assert _optimizing()
    with unoptimized():
        assert not _optimizing()
    assert _optimizing()
    with pytest.raises(ZeroDivisionError), unoptimized():
        raise ZeroDivisionError
    assert _optimizing()


@pytest.mark.parametrize("precision", ["float32", "float16"])
def test_the_update_and_the_forward_run_unoptimized_at_every_step(monkeypatch: pytest.MonkeyPatch,
                                                                  precision: str) -> None:
    monkeypatch.setenv("CSRUN_HALF_EMULATION", "rounding")
    real_update = lean_step.sgd_update()
    seen: dict[str, list[bool]] = {"update": [], "forward": []}

    def spy(kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            seen[kind].append(_optimizing())
            return fn(*args)
        return call

    monkeypatch.setattr(lean_step, "sgd_update", lambda: spy("update", real_update))
    data = mlp_batches(4)
    engine = make_engine(MLP(), data[0], precision, {"momentum": 0.9})
    engine.run_step(data[0])
    forward = engine._forward
    assert isinstance(forward, TracedForward), "the engine should run a trace of this graph"
    forward._fn = spy("forward", forward._fn)
    for batch in data[1:]:
        engine.run_step(batch)
    assert seen["update"] == [False] * 4, "the scripted update ran with the executor's optimizations on"
    assert seen["forward"] == [False] * 3, "the traced forward ran with the executor's optimizations on"
    assert _optimizing(), "the engine left this thread's executor switched"
