"""DeviceDriver on its own (no csrun.torch): compile at the first step, run on the embedded emulator,
switch to an eval program carrying the weights, pending states, closures with resolved handles."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import torch

from csrun.compiler.settings import CompileSettings
from csrun.driver.closures import StepClosure
from csrun.driver.driver import DeviceDriver, LoadedProgram, PendingState
from csrun.driver.options import DeviceOptions
from csrun.driver.run_path import RunPath
from csrun.driver.step_values import StepValue, in_closure
from csrun.driver.steps import StepOrderError
from csrun.stream.source import EPOCH_END
from tests.tiny_models import LinearClassifier

pytestmark = pytest.mark.timeout(60)


def batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(i)
    return torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g)


@pytest.fixture()
def driver(tmp_path: Path):
    options = DeviceOptions(path=RunPath(kind="embedded", reason="test"), model_dir=str(tmp_path),
                            settings=CompileSettings(mixed_precision=False))
    drv = DeviceDriver(options)
    yield drv
    drv.close()


def eager_losses(steps: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    model = LinearClassifier(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for i in range(steps):
        opt.zero_grad()
        loss = model(batch(i))
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, model.state_dict()


def test_train_then_eval_on_the_embedded_emulator(driver: DeviceDriver) -> None:
    model = driver.prepare_module(LinearClassifier(seed=0))
    opt = driver.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    seen: list[float] = []
    driver.begin_session("train")
    for i in range(3):
        opt.zero_grad()
        loss = model(batch(i))
        assert isinstance(loss, StepValue)
        loss.backward()
        opt.step()
        driver.end_step([StepClosure(fn=lambda v: seen.append(float(v)), args=(loss,))])
    driver.end_session(failed=False)
    want, weights = eager_losses(3)
    assert seen == pytest.approx(want, rel=1e-5)
    assert isinstance(driver.loaded, LoadedProgram) and driver.loaded.mode == "train"
    assert driver.global_step() == 3 and driver.compile_info is not None and driver.compile_info.mode == "train"
    state = driver.get_state()
    assert state["global_step"] == 3
    assert torch.allclose(state["model"]["fc.weight"], weights["fc.weight"], rtol=1e-5, atol=1e-6)

    driver.begin_session("eval")  # a new program, the trained weights carried over
    out = model(batch(0))
    driver.end_step([StepClosure(fn=lambda v: seen.append(float(v)), args=(out,))])
    driver.end_session(failed=False)
    assert driver.loaded.mode == "eval" and driver.global_step() == 3
    with torch.no_grad():
        reference = LinearClassifier(seed=0)
        reference.load_state_dict(weights)
        assert seen[-1] == pytest.approx(float(reference(batch(0))), rel=1e-5)


def test_the_step_boundary_sends_the_step_fetches_runs_its_closures_then_opens_the_next(
        driver: DeviceDriver) -> None:
    model = driver.prepare_module(LinearClassifier(seed=0))
    opt = driver.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    driver.begin_session("train")
    events: list[tuple[str, object]] = []

    def fetch(item: object) -> Callable[[], object]:
        def take() -> object:
            events.append(("fetch: a step open", driver.open_step is not None))
            return item
        return take

    ended: list[StepClosure] | None = None
    for i in range(2):
        step_batch = driver.next_step(fetch(batch(i)), ended)
        assert driver.open_step is not None and driver.open_step.batch is not step_batch  # step values
        opt.zero_grad()
        loss = model(step_batch)
        loss.backward()
        opt.step()
        ended = [StepClosure(fn=lambda v: events.append(("closure", float(v))), args=(loss,))]
    assert driver.next_step(fetch(EPOCH_END), ended) is EPOCH_END
    driver.end_session(failed=False)
    assert [e[0] for e in events] == ["fetch: a step open", "fetch: a step open", "closure",
                                      "fetch: a step open", "closure"]
    assert [e[1] for e in events if e[0] != "closure"] == [False, False, False]  # sent before the fetch
    assert [e[1] for e in events if e[0] == "closure"] == pytest.approx(eager_losses(2)[0], rel=1e-5)


def test_a_state_set_before_the_first_step_waits_as_pending(driver: DeviceDriver) -> None:
    model = driver.prepare_module(LinearClassifier(seed=0))
    opt = driver.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    start = {"model": {k: torch.zeros_like(v) for k, v in LinearClassifier(seed=0).state_dict().items()},
             "optimizer": {}, "amp": {}, "global_step": 5}
    driver.set_state(start, strict=True, load_optimizer=False)
    assert isinstance(driver.pending, PendingState) and driver.loaded is None
    assert torch.equal(driver.get_state()["model"]["fc.weight"], torch.zeros(2, 4))
    driver.begin_session("train")
    loss = model(batch(0))
    loss.backward()
    opt.step()
    driver.end_session(failed=False)
    assert driver.pending is None
    with in_closure():
        assert float(loss) == pytest.approx(float(torch.log(torch.tensor(2.0))), rel=1e-5)  # zero weights


def test_misuse_is_named(driver: DeviceDriver) -> None:
    model = driver.prepare_module(LinearClassifier(seed=0))
    opt = driver.prepare_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    driver.begin_session("train")
    model(batch(0))
    with pytest.raises(StepOrderError, match="before loss.backward"):
        opt.step()
