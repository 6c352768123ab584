"""The user API on a lone chief (in-process, no MPI): helpers, closures, Session, dtypes, backend seam."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import csrun.torch as cbtorch
from csrun.errors import UserError

pytestmark = [pytest.mark.timeout(30), pytest.mark.usefixtures("lone_chief")]  # tests/torch/conftest.py


class Pairs(Dataset):
    def __init__(self, n: int = 8, offset: int = 0) -> None:
        self.n, self.offset = n, offset

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return {"x": torch.full((2,), float(i)), "y": torch.tensor(i + self.offset)}



def _loader(n: int = 8, batch: int = 2, offset: int = 0):
    return cbtorch.dataloader(DataLoader(Pairs(n, offset), batch_size=batch, drop_last=True))


def test_helpers_on_a_lone_chief(capsys):
    cbtorch.initialize()
    assert cbtorch.is_master_ordinal() and not cbtorch.is_streamer()
    assert (cbtorch.get_ordinal(), cbtorch.get_streaming_rank(), cbtorch.task_id()) == (0, 0, 0)
    assert (cbtorch.num_tasks(), cbtorch.num_streamers(), cbtorch.use_cs()) == (1, 0, False)
    cbtorch.rendezvous("alone")
    assert cbtorch.mesh_reduce("sum", 5, sum) == 5
    cbtorch.master_print("hello", 1)
    assert capsys.readouterr().out == "hello 1\n"


def test_step_closures_run_in_order_at_the_end_of_their_step():
    log = []
    loader = _loader()

    @cbtorch.step_closure
    def decorated(step, tag="d"):
        log.append((tag, step))

    with cbtorch.Session(loader, mode="train", report=False):
        for step, batch in enumerate(loader):
            log.append(("body", step))
            cbtorch.add_step_closure(lambda s: log.append(("a", s)), (step,))
            decorated(step, tag="dec")
            assert log[-1] == ("body", step)  # nothing ran yet
        log.append(("after-loop",))
        for step, batch in enumerate(loader):
            cbtorch.add_step_closure(log.append, (("late", step),))
            break
        log.append(("after-break",))
    expected = [x for s in range(4) for x in (("body", s), ("a", s), ("dec", s))]
    assert log == expected + [("after-loop",), ("after-break",), ("late", 0)]


def test_batches_dtypes_and_stats_on_a_lone_chief(capsys):
    loader = _loader(8, 2)
    assert len(loader) == 4 and loader.batch_size == 2
    with cbtorch.Session(loader) as session:
        seen = [batch["y"] for batch in loader]
    assert [t.tolist() for t in seen] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert all(t.dtype == torch.int64 for t in seen)
    assert session.stats is not None and session.stats.chief.batches == 4
    assert session.stats.streamers == []
    assert "input stream" in capsys.readouterr().out  # on stdout, with the run's other lines


def test_lossy_int64_is_refused_on_the_cpu_too():
    loader = _loader(8, 2, offset=2**31)
    with pytest.raises(cbtorch.BatchError, match=r"int64 tensor at \['y'\] holds 2147483649"):
        with cbtorch.Session(loader, report=False):
            for _ in loader:
                pass


def test_skip_starts_at_a_global_batch_across_epochs():
    loader = _loader(8, 2)
    loader.skip(3)
    with cbtorch.Session(loader, report=False):
        first = [b["y"][0].item() for b in loader]
        second = [b["y"][0].item() for b in loader]
        with pytest.raises(cbtorch.DataLoaderError, match="before the first batch"):
            loader.skip(1)
    assert (first, second) == ([6], [0, 2, 4, 6])
    with pytest.raises(cbtorch.DataLoaderError, match="batch count >= 0, got -1"):
        _loader().skip(-1)


def test_session_refusals():
    with pytest.raises(cbtorch.SessionError, match="wrap it with cbtorch.dataloader"):
        cbtorch.Session(DataLoader(Pairs(), batch_size=2, drop_last=True))
    with pytest.raises(cbtorch.SessionError, match="mode must be one of train, eval, got 'predict'"):
        cbtorch.Session(_loader(), mode="predict")
    loader = _loader()
    with cbtorch.Session(loader, report=False):
        with pytest.raises(cbtorch.SessionError, match="do not nest"):
            cbtorch.Session(loader).__enter__()


def test_initialize_device_options():
    with pytest.raises(UserError, match="no device backend is installed"):
        cbtorch.initialize(cs_ip="10.0.0.5")
    with pytest.raises(UserError, match="Please set one of compile_only and validate_only"):
        cbtorch.initialize(compile_only=True, validate_only=True)
    made = []

    def factory(options):
        made.append(options)
        return cbtorch.EagerBackend()

    cbtorch.register_device_backend(factory)
    cbtorch.initialize(cs_ip="10.0.0.5")
    assert made[0].cs_ip == "10.0.0.5:9000" and cbtorch.use_cs()


class Recording(cbtorch.EagerBackend):
    """A backend that records the seam's calls (what a device backend would receive)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = []

    def begin_session(self, mode, loader=None):
        self.calls.append(("begin", mode))
        super().begin_session(mode, loader)

    def next_step(self, fetch, ended):
        item = super().next_step(fetch, ended)  # the ended step's closures: end_step, below
        if isinstance(item, dict):
            self.calls.append(("batch", item["y"].tolist()))
        return item

    def end_step(self, closures):
        self.calls.append(("end_step", len(closures)))
        super().end_step(closures)

    def end_session(self, failed):
        self.calls.append(("end", failed))


def test_backend_seam_sees_every_batch_and_step_boundary():
    backend = Recording()
    cbtorch.initialize(backend=backend)
    model = cbtorch.module(torch.nn.Linear(2, 1))
    assert cbtorch.optimizer(torch.optim.SGD(model.parameters(), lr=0.1)) is not None
    loader = _loader(4, 2)
    with cbtorch.Session(loader, mode="eval", report=False):
        assert not model.training
        for batch in loader:
            cbtorch.add_step_closure(lambda: None)
    assert backend.calls == [("begin", "eval"), ("batch", [0, 1]), ("end_step", 1), ("batch", [2, 3]),
                             ("end_step", 1), ("end", False)]
    with pytest.raises(UserError, match="needs a torch.nn.Module"):
        cbtorch.module(object())


def test_the_device_driver_and_the_eager_backend_both_are_backends():
    import inspect

    from csrun.driver.driver import DeviceDriver
    from csrun.torch.backend import Backend

    methods = [n for n, v in vars(Backend).items() if callable(v) and not n.startswith("_")]
    assert "next_step" in methods and "apply_settings" in methods
    for cls in (DeviceDriver, cbtorch.EagerBackend):
        for name in methods:
            want = inspect.signature(getattr(Backend, name))
            assert inspect.signature(getattr(cls, name)).parameters.keys() == want.parameters.keys(), (cls, name)
