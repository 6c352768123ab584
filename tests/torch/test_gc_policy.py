"""The collector during a run (csrun.torch.gc_policy): the heap built before the work is frozen at
initialize and at a Session's entry, given back at its exit; CSRUN_GC_FREEZE=0 leaves it alone."""

from __future__ import annotations

import gc
import subprocess
import sys
import weakref
from typing import Iterator

import pytest
import torch
from torch.utils.data import DataLoader

import csrun.torch as cbtorch
from csrun.errors import UserError
from csrun.torch.gc_policy import freeze_enabled
from tests.conftest import REPO, base_env

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def unfrozen_after(monkeypatch: pytest.MonkeyPatch, lone_chief: None) -> Iterator[None]:
    """A lone chief (tests/torch/conftest.py) with the default setting; nothing left frozen after."""
    monkeypatch.delenv("CSRUN_GC_FREEZE", raising=False)
    yield
    assert gc.get_freeze_count() == 0


class Cycle:
    """Garbage only a collection frees: it refers to itself."""

    def __init__(self) -> None:
        self.me = self


def _loader() -> cbtorch.StreamingDataLoader:
    return cbtorch.dataloader(DataLoader(torch.arange(16.0), batch_size=4, drop_last=True))


@pytest.mark.parametrize("value, on", [("", True), ("1", True), ("on", True), ("TRUE", True), ("yes", True),
                                       ("0", False), ("off", False), ("false", False), (" No ", False)])
def test_the_setting_reads_the_usual_spellings(monkeypatch: pytest.MonkeyPatch, value: str, on: bool) -> None:
    monkeypatch.setenv("CSRUN_GC_FREEZE", value)
    assert freeze_enabled() is on


def test_a_bad_setting_names_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CSRUN_GC_FREEZE", "maybe")
    with pytest.raises(UserError, match=r"^CSRUN_GC_FREEZE: 'maybe' is not yes or no \(1/0, true/false, yes/no, on/off\) \(a Session freezes"):
        cbtorch.initialize()
    assert gc.get_freeze_count() == 0


def test_initialize_and_the_session_freeze_and_its_exit_gives_back() -> None:
    cbtorch.initialize()
    assert gc.get_freeze_count() > 0  # the imports
    loader = _loader()
    with cbtorch.Session(loader):
        frozen = gc.get_freeze_count()
        assert frozen > 0
        for _ in loader:
            pass
    assert gc.get_freeze_count() == 0
    with cbtorch.Session(loader):  # a second session freezes again
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0


def test_garbage_made_in_the_session_is_still_collected_and_old_garbage_after_it() -> None:
    cbtorch.initialize()
    old = Cycle()
    old_ref = weakref.ref(old)
    del old  # garbage already, but frozen with the session's entry
    loader = _loader()
    with cbtorch.Session(loader):
        new = Cycle()
        new_ref = weakref.ref(new)
        del new
        gc.collect()
        assert new_ref() is None  # the session's own garbage goes as before
        assert old_ref() is not None  # the frozen heap is not scanned
    gc.collect()
    assert old_ref() is None  # given back at the exit: collected


def test_off_leaves_the_collector_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CSRUN_GC_FREEZE", "0")
    cbtorch.initialize()
    loader = _loader()
    with cbtorch.Session(loader):
        assert gc.get_freeze_count() == 0


def test_a_bad_setting_stops_run_py_with_one_line(tmp_path) -> None:
    done = subprocess.run([sys.executable, str(REPO / "models" / "fc_mnist" / "run.py"), "--cpu", "--mode", "train",
                           "--params", str(REPO / "configs" / "fc_mnist_debug.yaml"), "-o", str(tmp_path / "md")],
                          env=base_env(CSRUN_GC_FREEZE="maybe"), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("run.py: error: CSRUN_GC_FREEZE: 'maybe' is not yes or no")
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "md" / "train").exists()  # stopped before it wrote anything
