"""The chief's loop on the embedded device: handles, closures, side effects, order, eval."""

from __future__ import annotations

import threading

import pytest
import torch
from torch.utils.data import DataLoader

import csrun.torch as cbtorch
from csrun.emulator.errors import DeviceTensorReadError
from csrun.driver.steps import GradientAccumulation, StepOrderError

from . import helpers
from .helpers import CountingMLP, dataset, settings, sgd, train

pytestmark = pytest.mark.timeout(60)


def setup(model_dir: str, cs_ip: str | None = "embedded"):
    cbtorch.initialize(cs_ip, settings=settings(), model_dir=model_dir)
    torch.manual_seed(1)
    model = cbtorch.module(CountingMLP())
    opt = cbtorch.optimizer(sgd(model.parameters()))
    loader = cbtorch.dataloader(DataLoader(dataset(), batch_size=8, drop_last=True))
    return model, opt, loader


def test_reading_a_handle_in_the_loop_raises_the_step_closure_hint(model_dir: str) -> None:
    model, opt, loader = setup(model_dir)
    with cbtorch.Session(loader, report=False):
        for batch in loader:
            loss = model(batch)
            with pytest.raises(DeviceTensorReadError, match="read them in a step closure"):
                loss.item()
            with pytest.raises(DeviceTensorReadError, match="step closure"):
                print(loss)
            loss.backward()
            opt.step()
            break


def test_closures_run_in_order_with_their_own_steps_values(model_dir: str) -> None:
    cpu = train(None, steps=6, model_dir=model_dir)
    events: list[tuple] = []
    cbtorch_state = {}

    def each_step(n: int, loss) -> None:
        cbtorch.add_step_closure(lambda l, n=n: events.append(("first", n, l.item())), (loss,))
        cbtorch.add_step_closure(lambda d, n=n: events.append(("second", n, d["x"].item())), ({"x": loss},))
        cbtorch_state[n] = cbtorch.global_step()

    dev = train("embedded", steps=6, model_dir=model_dir, each_step=each_step)
    # per step: the loop's record() closure, then first, then second; each with that step's loss
    assert [e[:2] for e in events] == [(k, n) for n in range(6) for k in ("first", "second")]
    assert [e[2] for e in events if e[0] == "first"] == pytest.approx(cpu.losses, rel=1e-6)
    assert [e[2] for e in events if e[0] == "second"] == dev.losses
    assert cbtorch_state == {n: n + 1 for n in range(6)}


def test_an_async_closure_error_surfaces_at_the_next_boundary(model_dir: str) -> None:
    model, opt, loader = setup(model_dir)
    threads: list[str] = []
    forwards = 0

    def boom(loss: torch.Tensor) -> None:
        threads.append(threading.current_thread().name)
        raise ValueError(f"boom after loss {loss.item():.3f}")

    with pytest.raises(ValueError, match="boom after loss"):
        with cbtorch.Session(loader, report=False):
            for batch in loader:
                forwards += 1
                opt.zero_grad()
                loss = model(batch)
                loss.backward()
                opt.step()
                if forwards == 3:
                    cbtorch.add_step_closure(boom, (loss,), run_async=True)
    # step 3's boundary queued it on the closure thread (overlapping step 4); the next boundary,
    # asking for batch 5, raised its error before step 5 ran
    assert forwards == 4
    assert threads and threads[0] != threading.main_thread().name


@pytest.mark.parametrize("cs_ip,verify,calls", [(None, "1", 5), ("embedded", "0", 2), ("embedded", "1", 3)])
def test_the_python_forward_runs_in_the_first_step_only_on_the_device_every_step_on_the_cpu(
        model_dir: str, cs_ip, verify: str, calls: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """On the device the forward runs twice in step 1 (recorded on the CPU for shapes, then
    captured by torch.export), a third time when step 1 is checked against eager PyTorch (on
    a copy of the model: csrun.driver.verify), and never again; on the CPU once per step."""
    monkeypatch.setenv("CSRUN_VERIFY_STEPS", verify)
    helpers.FORWARD_CALLS.count = 0
    train(cs_ip, steps=5, model_dir=model_dir)
    assert helpers.FORWARD_CALLS.count == calls


def test_steps_out_of_order_are_refused(model_dir: str) -> None:
    model, opt, loader = setup(model_dir)
    with pytest.raises(StepOrderError, match=r"optimizer.step\(\) was called before loss.backward\(\).*in this order"):
        with cbtorch.Session(loader, report=False):
            for batch in loader:
                model(batch)
                opt.step()
    cbtorch.initialize("embedded", settings=settings(), model_dir=model_dir)
    model, opt, loader = setup(model_dir)
    with pytest.raises(GradientAccumulation, match=r"test_device_loop.py:\d+: gradient accumulation: loss.backward\(\) "
                       r"without optimizer.step\(\).*weight-streaming mode"):
        with cbtorch.Session(loader, report=False):
            for batch in loader:
                model(batch).backward()


def test_eval_after_training_uses_the_trained_weights(model_dir: str) -> None:
    model, opt, loader = setup(model_dir)
    with cbtorch.Session(loader, report=False):
        for i, batch in enumerate(loader):
            opt.zero_grad()
            model(batch).backward()
            opt.step()
            if i == 4:
                break
    trained = cbtorch.get_state()
    eval_loader = cbtorch.dataloader(DataLoader(dataset(), batch_size=8, drop_last=True))
    losses: list[float] = []
    with cbtorch.Session(eval_loader, mode="eval", report=False):
        for i, batch in enumerate(eval_loader):
            cbtorch.add_step_closure(lambda l: losses.append(l.item()), (model(batch),))
            if i == 2:
                break
    assert cbtorch.compile_info().mode == "eval" and cbtorch.global_step() == 5
    reference = CountingMLP()
    reference.load_state_dict(trained["model"])
    with torch.no_grad():
        want = [reference(b).item() for b, _ in zip(DataLoader(dataset(), batch_size=8), range(3))]
    assert losses == pytest.approx(want, rel=1e-6)
    assert cbtorch.get_state()["global_step"] == 5
    # a fresh run evaluating a checkpoint: set_state before the eval program exists
    cbtorch.initialize("embedded", settings=settings(), model_dir=model_dir)
    torch.manual_seed(99)
    model = cbtorch.module(CountingMLP())
    cbtorch.set_state(trained)
    again: list[float] = []
    eval_loader = cbtorch.dataloader(DataLoader(dataset(), batch_size=8, drop_last=True))
    with cbtorch.Session(eval_loader, mode="eval", report=False):
        for i, batch in enumerate(eval_loader):
            cbtorch.add_step_closure(lambda l: again.append(l.item()), (model(batch),))
            if i == 2:
                break
    assert again == losses and cbtorch.global_step() == 5
    assert cbtorch.compile_info().programming_time > 0


def test_validate_only_stops_after_the_first_step_with_exit_status_0(model_dir: str, capsys) -> None:
    """The whole first step is recorded, then validated at its boundary; the second never runs."""
    cbtorch.initialize(validate_only=True, settings=settings(), model_dir=model_dir)
    model = cbtorch.module(CountingMLP())
    cbtorch.optimizer(sgd(model.parameters()))
    loader = cbtorch.dataloader(DataLoader(dataset(), batch_size=8, drop_last=True))
    steps = 0
    with pytest.raises(SystemExit) as stop:
        with cbtorch.Session(loader, report=False):
            for batch in loader:
                model(batch)
                steps += 1
    assert stop.value.code == 0 and steps == 1
    assert "Validation completed successfully!" in capsys.readouterr().out
    assert cbtorch.compile_info() is not None


class _Recording(torch.utils.data.Dataset):
    """The device-test dataset, noting each batch's fetch in ``events``."""

    def __init__(self, events: list[tuple]) -> None:
        self.inner, self.events = dataset(), events

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i: int):
        if i % 8 == 0:
            self.events.append(("fetch", i // 8))
        return self.inner[i]


@pytest.mark.parametrize("cs_ip", ["embedded", None], ids=["device", "cpu"])
def test_the_next_batch_is_fetched_before_the_closures_which_see_their_own_step(model_dir: str, cs_ip) -> None:
    events: list[tuple] = []
    cbtorch.initialize(cs_ip, settings=settings(), model_dir=model_dir)
    torch.manual_seed(1)
    model = cbtorch.module(CountingMLP())
    opt = cbtorch.optimizer(sgd(model.parameters()))
    loader = cbtorch.dataloader(DataLoader(_Recording(events), batch_size=8, drop_last=True))
    with cbtorch.Session(loader, report=False):
        for step, batch in enumerate(loader):
            loss = model(batch)
            loss.backward()
            opt.step()
            opt.zero_grad()
            cbtorch.add_step_closure(
                lambda n: events.append(("closure", n, cbtorch.get_state()["global_step"])), (step,))
            if step == 3:
                break
    # batch n+1 is fetched (the input work overlaps the device's step n), then step n's closure
    # runs, seeing the state after its own step; batch n+2 is not fetched before it
    assert events[:7] == [("fetch", 0), ("fetch", 1), ("closure", 0, 1), ("fetch", 2), ("closure", 1, 2),
                          ("fetch", 3), ("closure", 2, 3)]


def test_values_kept_for_a_later_closure_do_not_keep_their_batches(model_dir: str) -> None:
    """A loop that keeps each step's loss to read it steps later (the runner's grouped loss rows):
    once a step went to the device, its batch is the device's; the kept loss must not hold it."""
    import gc
    import weakref

    model, opt, loader = setup(model_dir)
    kept, batches, alive = [], [], None
    with cbtorch.Session(loader, report=False):
        for step, batch in enumerate(loader):
            batches.append(weakref.ref(batch[0]._value))  # the tensor under the loop's host step value
            if step == 9:  # steps 0-5 have run on the device (two steps in flight at most)
                gc.collect()
                alive = [i for i in range(6) if batches[i]() is not None]
            opt.zero_grad()
            loss = model(batch)
            loss.backward()
            opt.step()
            kept.append(loss)
            if step == 9:
                break
        cbtorch.add_step_closure(lambda *losses: None, tuple(kept))
    assert alive == [], f"the batches of steps {alive} are still alive while their losses are kept"
    assert len(kept) == 10
