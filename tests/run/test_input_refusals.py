"""The params and run.py flags issue 45 found accepted or turned into tracebacks (items 5 and 6),
through fc_mnist's run.py: each is one line naming the key and the value, exit 2, nothing built.
A model too big for this machine is refused from its shapes; SIGTERM outside the training loop
stops the run at once (exit 143), where it used to be a flag nothing read until the first step."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any, Callable

import pytest
import yaml

from tests.run.conftest import DEBUG_YAML

Run = Callable[..., int]


def _params(tmp_path: Path, section: str, key: str, value: Any) -> Path:
    data = yaml.safe_load(DEBUG_YAML.read_text())
    data[section][key] = value
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("section, key, value, says", [
    ("train_input", "shuffle_seed", -1e308, "train_input.shuffle_seed: -1e+308 must be at least 0"),
    ("optimizer", "loss_scaling_factor", float("inf"), "optimizer.loss_scaling_factor: inf must be a finite number"),
    ("optimizer", "loss_scaling_factor", -7, "optimizer.loss_scaling_factor: -7 must be greater than 0"),
    ("optimizer", "momentum", float("inf"), "optimizer.momentum: inf must be a finite number (valid: at least 0)"),
    ("model", "depth", 1e100, "model.depth: 1e+100 must be at most 1024 (valid: at least 1 and at most 1024)"),
    ("model", "hidden_size", 10**8, "model: its shapes make 10,000,007,600,000,010 parameters (36379.8 TiB of float32 "
                                    "weights), more than this machine's memory"),
], ids=["shuffle_seed", "loss_scaling_factor=inf", "loss_scaling_factor=-7", "momentum", "depth", "size"])
def test_a_nonsense_params_value_is_one_line(fc_mnist: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                             section: str, key: str, value: Any, says: str) -> None:
    params = _params(tmp_path, section, key, value)
    for mode in (["--validate_only"], ["--cpu"]):
        assert fc_mnist("-p", str(params), "-m", "train", "-o", str(tmp_path / "md"), *mode) == 2
        err = capsys.readouterr().err.strip()
        assert err.splitlines() == [err] and says in err, err
        assert not (tmp_path / "md" / "checkpoint_0.mdl").exists()


@pytest.mark.parametrize("cs_ip", ["::::", "http://host:9000", "1.2.3.4:9000:1", "x" * 300, "-host", ""])
def test_cs_ip_junk_is_refused_under_validate_only(fc_mnist: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                  cs_ip: str) -> None:
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(tmp_path / "md"), "--validate_only",
                    f"--cs_ip={cs_ip}") == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and (f"bad host {cs_ip!r}" if cs_ip else "the address is empty") in err, err


@pytest.mark.timeout(120)  # before the fix a FIFO's open waited forever for a writer, /dev/zero read without end
@pytest.mark.parametrize("what", ["fifo", "/dev/zero", "directory"])
def test_a_params_path_that_is_no_file_is_one_line(fc_mnist: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   what: str) -> None:
    path = {"fifo": tmp_path / "fifo", "/dev/zero": Path("/dev/zero"), "directory": tmp_path}[what]
    if what == "fifo":
        os.mkfifo(path)
    assert fc_mnist("-p", str(path), "-m", "train", "-o", str(tmp_path / "md"), "--validate_only") == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [err] and f"--params {path}: " in err and "not a file; give a YAML file" in err, err


def test_sigterm_outside_the_training_loop_stops_at_once(fc_mnist: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A model that takes long to build (here: SIGTERM arrives while it builds) ends there: the
    build goes no further, exit 143 with one line; the run saved nothing."""
    import model as fc_model  # models/fc_mnist/model.py, importable under the fc_mnist fixture

    built: list[bool] = []
    real = fc_model.FcMnist

    class SlowToBuild(real):  # type: ignore[misc, valid-type]
        def __init__(self, cfg: Any) -> None:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100_000):  # the build goes on in Python: the handler's exception stops it
                pass
            built.append(True)
            super().__init__(cfg)

    monkeypatch.setattr(fc_model, "FcMnist", SlowToBuild)
    before = signal.getsignal(signal.SIGTERM)
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(tmp_path / "md")) == 143
    err = capsys.readouterr().err.strip()
    assert built == [] and err.splitlines() == [err] and "stopped by SIGTERM outside the training loop" in err
    assert not list((tmp_path / "md").glob("checkpoint_*.mdl"))
    assert signal.getsignal(signal.SIGTERM) is before  # the run's handler is gone with the run


def test_sigterm_in_the_loop_and_the_preemption_signal_keep_their_checkpoint_meaning(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """In the loop SIGTERM is still a flag (checkpoint at the next step); so is SIGTERM anywhere when
    it is the preemption signal (CSRUN_PREEMPT_SIGNAL=TERM)."""
    from csrun.run.preemption import Preemption, Terminated

    with Preemption() as p:
        p.stops_at_steps = True
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):
            pass
        assert p.requested and p.signum == signal.SIGTERM
    with pytest.raises(Terminated):
        with Preemption():
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):
                pass
    monkeypatch.setenv("CSRUN_PREEMPT_SIGNAL", "TERM")
    with Preemption() as p:
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(1000):
            pass
        assert p.requested
