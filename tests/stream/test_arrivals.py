"""The arrival board before MPI_Init (csrun.stream.arrivals): who shares the node, the wait, the
cleanup, what it refuses, and a real mpiexec job whose chief comes late."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from csrun.cluster import cluster_info, tasks_on_node
from csrun.errors import UserError
from csrun.stream import arrivals, wire
from tests.conftest import REPO


@pytest.fixture()
def tmpdir_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


SLURM_VARS = ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_NODEID", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE",
              "SLURM_HET_SIZE", "MPI_LOCALNRANKS", "MPI_LOCALRANKID", "PMI_RANK", "PMI_SIZE", "CSRUN_MPI_ARRIVALS",
              "CSRUN_MPI_ARRIVALS_WAIT")


def slurm_env(**over: str) -> dict[str, str]:
    env = {"SLURM_JOB_ID": "41", "SLURM_STEP_ID": "0", "SLURM_NODEID": "0", "SLURM_LOCALID": "1",
           "SLURM_STEP_TASKS_PER_NODE": "2,1"}
    return {**env, **over}


def board(env: dict[str, str], hydra_key: str | None = None) -> arrivals.Board | None:
    return arrivals.board_for(cluster_info(env), hydra_key=hydra_key)


@pytest.fixture()
def task_env(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    """Set this process's environment to one task's (the board reads it through cluster_info)."""
    for name in SLURM_VARS:
        monkeypatch.delenv(name, raising=False)

    def put(env: dict[str, str]) -> None:
        for name, value in env.items():
            monkeypatch.setenv(name, value)

    return put


@pytest.mark.parametrize("text, node, count", [("2,1", 0, 2), ("2,1", 1, 1), ("2(x3),1", 2, 2), ("2(x3),1", 3, 1),
                                               ("4", 0, 4), ("2,1", 2, None), ("2(x,1", 0, None), ("", 0, None)])
def test_tasks_on_node_reads_slurms_compressed_counts(text: str, node: int, count: int | None) -> None:
    assert tasks_on_node(text, node) == count


def test_board_for_mpiexec_and_slurm_steps_and_nothing_else(tmpdir_root: Path) -> None:
    hydra = board({"MPI_LOCALNRANKS": "3", "MPI_LOCALRANKID": "2"}, hydra_key="proxy-7-99")
    assert hydra is not None and hydra.expected == 3 and hydra.name == "rank-2"
    assert hydra.folder == tmpdir_root / f"csrun-mpi-arrivals-{os.getuid()}-proxy-7-99"
    slurm = board(slurm_env())
    assert slurm is not None and slurm.expected == 2 and slurm.name == "rank-1"
    assert slurm.folder.name.endswith("slurm-41.0-node0")
    assert board(slurm_env(SLURM_NODEID="1")) is None  # alone on its node: nothing to wait for
    assert board(slurm_env(SLURM_HET_SIZE="2")) is None  # a heterogeneous step: no board
    assert board({}) is None
    assert board({"OMPI_COMM_WORLD_LOCAL_SIZE": "2"}) is None


def test_the_switch_turns_the_board_off_and_bad_settings_are_named(tmpdir_root: Path, task_env) -> None:  # noqa: ANN001
    task_env(slurm_env(CSRUN_MPI_ARRIVALS="off"))
    assert wire._sign_in_on_the_board() is None
    assert os.listdir(tmpdir_root) == []
    task_env({"CSRUN_MPI_ARRIVALS": "maybe"})
    with pytest.raises(UserError, match="^CSRUN_MPI_ARRIVALS: 'maybe' is not yes or no"):
        wire._sign_in_on_the_board()
    task_env({"CSRUN_MPI_ARRIVALS": "on", "CSRUN_MPI_ARRIVALS_WAIT": "-1"})
    with pytest.raises(UserError, match="CSRUN_MPI_ARRIVALS_WAIT"):
        wire._sign_in_on_the_board()


def test_a_task_sleeps_until_its_node_peer_signs_in_then_both_clean_up(tmpdir_root: Path, task_env) -> None:  # noqa: ANN001
    peer = board(slurm_env(SLURM_LOCALID="0"))
    assert peer is not None
    came = threading.Event()

    def late_peer() -> None:
        time.sleep(0.3)
        came.set()
        (peer.folder / peer.name).touch()

    task_env(slurm_env(CSRUN_MPI_ARRIVALS_WAIT="20"))
    threading.Thread(target=late_peer).start()
    mine = wire._sign_in_on_the_board()
    assert came.is_set()  # it returned only after the peer's file appeared
    assert mine is not None and sorted(os.listdir(mine.folder)) == ["rank-0", "rank-1"]
    assert mine.folder.stat().st_mode & 0o777 == 0o700
    arrivals.leave(mine)
    assert mine.folder.exists()  # the peer is still signed in
    arrivals.leave(peer)
    assert not mine.folder.exists()


def test_a_peer_that_never_comes_holds_the_task_only_for_the_wait_limit(tmpdir_root: Path, task_env) -> None:  # noqa: ANN001
    task_env(slurm_env(CSRUN_MPI_ARRIVALS_WAIT="0.2"))
    mine = wire._sign_in_on_the_board()
    assert mine is not None and os.listdir(mine.folder) == ["rank-1"]
    arrivals.leave(mine)
    assert not mine.folder.exists()


def test_a_folder_others_may_write_is_not_used(tmpdir_root: Path, task_env) -> None:  # noqa: ANN001
    theirs = board(slurm_env())
    assert theirs is not None
    theirs.folder.mkdir()
    theirs.folder.chmod(0o777)
    task_env(slurm_env(CSRUN_MPI_ARRIVALS_WAIT="20"))
    assert wire._sign_in_on_the_board() is None
    assert os.listdir(theirs.folder) == []  # nothing written into it
    theirs.folder.rmdir()
    theirs.folder.write_text("not a folder")
    assert wire._sign_in_on_the_board() is None
    assert theirs.folder.read_text() == "not a folder"


SCRIPT = """
import os, sys, time
from csrun.stream import arrivals
from csrun.stream.wire import mpi
rank = int(os.environ["PMI_RANK"])
if rank == 0:
    time.sleep(1.5)  # the chief still building its model
from csrun.cluster import cluster_info
found = arrivals.board_for(cluster_info())
MPI = mpi()
total = MPI.COMM_WORLD.allreduce(rank)
print(f"rank {rank} board {found is not None} sum {total}", flush=True)
"""


def test_mpiexec_tasks_use_the_board_and_leave_nothing_behind(mpiexec: Path, tmp_path: Path) -> None:
    root = tmp_path / "tmp"
    root.mkdir()
    env = {**os.environ, "TMPDIR": str(root), "PYTHONPATH": str(REPO)}
    for name in ("SLURM_JOB_ID", "SLURM_STEP_ID", "CSRUN_MPI_ARRIVALS"):
        env.pop(name, None)
    done = subprocess.run([str(mpiexec), "-n", "3", sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert sorted(re.findall(r"rank \d board \w+ sum \d+", done.stdout)) == [f"rank {r} board True sum 3" for r in range(3)]
    assert os.listdir(root) == []  # the board folder went with the last task out


def test_a_board_whose_launch_is_gone_is_swept(tmpdir_root: Path, task_env) -> None:  # noqa: ANN001
    dead = tmpdir_root / f"csrun-mpi-arrivals-{os.getuid()}-proxy-999999999-1"
    dead.mkdir(mode=0o700)
    (dead / "rank-0").touch()
    alive = tmpdir_root / f"csrun-mpi-arrivals-{os.getuid()}-slurm-5.0-node0"  # not an mpiexec board: kept
    alive.mkdir(mode=0o700)
    task_env(slurm_env(CSRUN_MPI_ARRIVALS_WAIT="0.05"))
    mine = wire._sign_in_on_the_board()
    assert not dead.exists() and alive.exists()
    arrivals.leave(mine)
