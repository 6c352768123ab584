"""Failures of the machine, not of the input: one line naming what failed, exit 1, model_dir intact.

Disk full (a real 120 KiB tmpfs: room for one fc_mnist checkpoint, not two), model_dir a file,
a folder where the checkpoint goes, and the emulator server killed mid-training.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable, Iterator

import pytest

from csrun.run import loops
from tests.conftest import REPO
from tests.run.conftest import DEBUG_YAML

Run = Callable[..., int]
pytestmark = pytest.mark.timeout(120)


def one_error_line(err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("run.py: error: ") or ": error: " in lines[0], err
    return lines[0]


@pytest.fixture()
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "tiny"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=120k", "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"a small tmpfs cannot be mounted here (needs root or CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_disk_full_during_a_checkpoint(fc_mnist: Run, tiny_disk: Path, capsys: pytest.CaptureFixture[str]) -> None:
    md = tiny_disk / "md"
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(md), "--cpu") == 1
    line = one_error_line(capsys.readouterr().err)
    assert f"cannot save checkpoint {md}/checkpoint_200.mdl: No space left on device [ENOSPC]" in line
    assert sorted(p.name for p in md.glob("checkpoint_*")) == ["checkpoint_100.mdl", "checkpoint_100.mdl.sha256"]
    assert not list(md.glob(".*.tmp"))


def test_model_dir_that_is_a_file(fc_mnist: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    md = tmp_path / "md"
    md.write_text("keep me")
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(md), "--cpu") == 1
    assert f"model_dir {md} is a file, not a folder" in one_error_line(capsys.readouterr().err)
    assert md.read_text() == "keep me"


def test_a_folder_where_the_checkpoint_goes(fc_mnist: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    md = tmp_path / "md"
    (md / "checkpoint_200.mdl").mkdir(parents=True)
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(md), "--cpu") == 1
    line = one_error_line(capsys.readouterr().err)
    assert f"cannot save checkpoint {md}/checkpoint_200.mdl: a folder of that name is in the way" in line
    assert (md / "checkpoint_100.mdl").is_file() and (md / "checkpoint_200.mdl").is_dir()


def test_the_server_dying_mid_training(fc_mnist: Run, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    import secrets

    token = secrets.token_urlsafe(32)
    env = {**os.environ, "CSRUN_EMULATOR_TOKEN": token}
    server = subprocess.Popen([sys.executable, "-m", "csrun.cli.cs_emulator", "--listen", "127.0.0.1:0", "--log-level", "warning"],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        while "listening on 127.0.0.1:" not in (line := server.stdout.readline()):
            assert line, server.stderr.read() if server.stderr else "server ended"
        port = int(line.split("127.0.0.1:")[1].split()[0])
        monkeypatch.setenv("CSRUN_EMULATOR_TOKEN", token)
        wants = loops._StepBook.wants

        def kill_at_50(self: loops._StepBook, step: int, unread: int) -> bool:  # the loop asks this after every step
            if step == 50:
                server.send_signal(signal.SIGKILL)
                server.wait(10)
            return wants(self, step, unread)

        monkeypatch.setattr(loops._StepBook, "wants", kill_at_50)
        md = tmp_path / "md"
        code = fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(md), "--cs_ip", f"127.0.0.1:{port}")
        err = capsys.readouterr().err
        assert code == 1, err
        assert f"127.0.0.1:{port}" in one_error_line(err)
    finally:
        if server.poll() is None:
            server.kill()
        server.communicate(timeout=10)
