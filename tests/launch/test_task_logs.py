"""``--log-dir``: one log file per task, the console keeping the chief's; a failed task's line
names its file; csrun's log records reach a user's own handlers once (issue 14).

Local mode (mpiexec) and, for the file layout, the local Slurm cluster. The job is
tests/launch/scripts/failing_task.py (every task prints ``rank N starting``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import BIN, base_env

SCRIPT = Path(__file__).parent / "scripts" / "failing_task.py"
pytestmark = pytest.mark.timeout(180)


def wse(env: dict[str, str], cwd: Path, *options: str, fail: str = "-1:none:0") -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "csrun_wse"), "--total-nodes", "3", *options, sys.executable, str(SCRIPT)],
                          env={**env, "FAIL": fail}, capture_output=True, text=True, timeout=150, cwd=cwd)


def one_file_per_rank(folder: Path) -> dict[int, str]:
    files = sorted(folder.glob("*.log"))
    by_rank = {int(p.stem.rsplit("-", 1)[1]): p.read_text() for p in files}
    assert sorted(by_rank) == [0, 1, 2], [p.name for p in files]
    assert len({p.stem.rsplit("-", 1)[0] for p in files}) == 1, "the files of one job carry one job label"
    return by_rank


def assert_each_task_in_its_own_file(by_rank: dict[int, str], console: str) -> None:
    for rank, text in by_rank.items():
        assert f"rank {rank} starting" in text, text
        assert text.startswith("=== "), "each attempt starts with a header line"
        body = [ln for ln in text.splitlines() if not ln.startswith("=== ")]
        assert body and all(ln.startswith(f"[rank {rank}] ") for ln in body), text
        others = [r for r in by_rank if r != rank]
        assert not any(f"rank {r} starting" in text for r in others), text
    assert "rank 0 done" in by_rank[0] and "rank 0 done" in console, console
    assert "rank 1 starting" not in console and "rank 2 starting" not in console, "streamers' output stays in their files"


def test_local_job_writes_one_file_per_task(no_slurm_env: dict[str, str], tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    done = wse(no_slurm_env, tmp_path, "--log-dir", str(logs))
    assert done.returncode == 0, done.stdout + done.stderr
    by_rank = one_file_per_rank(logs)
    assert all(p.name.startswith("local-") for p in logs.glob("*.log"))
    assert_each_task_in_its_own_file(by_rank, done.stdout + done.stderr)


def test_without_log_dir_every_task_reaches_the_console(no_slurm_env: dict[str, str], tmp_path: Path) -> None:
    done = wse(no_slurm_env, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in range(3):
        assert f"rank {rank} starting" in done.stdout, done.stdout
    assert not list(tmp_path.rglob("*.log"))


def test_a_failed_tasks_line_names_its_file(no_slurm_env: dict[str, str], tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    done = wse(no_slurm_env, tmp_path, "--log-dir", str(logs), fail="1:stream:9")
    assert done.returncode == 9, done.stdout + done.stderr
    line = next(ln for ln in done.stderr.splitlines() if "task rank 1 on " in ln)
    named = Path(line.split("(its output: ", 1)[1].rstrip(")"))
    assert named.parent == logs.resolve() and named.name.endswith("-1.log"), line
    assert named.read_text().startswith("=== ")


@pytest.mark.parametrize("bad", ["/proc/csrun-logs", "{file}/sub"])
def test_a_log_dir_that_cannot_be_made_is_one_line(no_slurm_env: dict[str, str], tmp_path: Path, bad: str) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    bad = bad.format(file=a_file)
    done = wse(no_slurm_env, tmp_path, "--log-dir", bad)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"--log-dir {bad}" in lines[0] and "Traceback" not in done.stderr, done.stderr
    assert "rank 0 done" not in done.stdout, "no task started"


@pytest.mark.slurm
def test_slurm_job_writes_one_file_per_task(slurm_env: dict[str, str], tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    done = wse(slurm_env, tmp_path, "--tasks-per-node", "1", "--log-dir", str(logs))
    assert done.returncode == 0, done.stdout + done.stderr
    by_rank = one_file_per_rank(logs)
    assert all(p.stem.rsplit("-", 1)[0].isdigit() for p in logs.glob("*.log")), "named by the Slurm job id"
    assert_each_task_in_its_own_file(by_rank, done.stdout + done.stderr)


LOGGING = """
import logging, sys
{user}
from csrun.run.logs import setup_logging
setup_logging("INFO")
logging.getLogger("csrun.run.test").info("one record")
logging.getLogger("csrun.run.test").debug("hidden record")
"""


@pytest.mark.parametrize("user, console_lines, in_file", [
    ("", 1, False),                                                      # csrun's own handler
    ("logging.basicConfig()", 1, False),                                # the user's console handler instead
    ("logging.basicConfig(filename=sys.argv[1], format='%(csrun_task)s|%(message)s')", 1, True),
])
def test_csrun_records_reach_the_users_handlers_once(tmp_path: Path, user: str, console_lines: int, in_file: bool) -> None:
    log_file = tmp_path / "user.log"
    done = subprocess.run([sys.executable, "-c", LOGGING.format(user=user), str(log_file)], env=base_env(),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    console = (done.stdout + done.stderr).splitlines()
    assert sum("one record" in ln for ln in console) == console_lines, console
    assert not any("hidden record" in ln for ln in console)
    if not user:
        # off a terminal the line starts with the time of day (csrun.consoles.time_prefix)
        assert any(re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d )?INFO \[chief 0 @ .*\]: one record$", ln)
                   for ln in console), console
    if in_file:
        assert log_file.read_text().splitlines() == ["chief 0 @ " + log_file.read_text().split("chief 0 @ ", 1)[1]
                                                     .split("|", 1)[0] + "|one record"]


def test_csrun_cpu_writes_the_tasks_file_and_keeps_the_console(no_slurm_env: dict[str, str], tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    done = subprocess.run([str(BIN / "csrun_cpu"), "--log-dir", str(logs), sys.executable, "-c",
                           "import sys; print('to stdout'); print('to stderr', file=sys.stderr)"],
                          env=no_slurm_env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    [only] = logs.glob("*-0.log")
    text = only.read_text()
    assert "to stdout" in text and "to stderr" in text, text
    assert "[rank 0] to stdout" in text and "[rank 0] to stderr" in text, text
    assert "to stdout" in done.stdout and "to stderr" in done.stderr, "the one task is the chief: its console stays"
    assert "[rank 0]" not in done.stdout, "the console's lines are the task's own"
