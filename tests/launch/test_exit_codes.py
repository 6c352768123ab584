"""The job's exit code is its first failure's, every time (issue 33 item 5).

A three-task csrun_wse job in local mode (tests/launch/scripts/failing_task.py under python-pt,
so under mpi4py's runner, whose uncaught exception or ``sys.exit(N)`` ends in ``MPI_Abort``)
fails the same way three times over, and each time the job must exit with the same code and
name the same rank: a streamer that raises (1), that calls ``sys.exit(6)`` (6), whose process is
SIGKILLed (137, "exited"), and whose csrun wrapper is SIGKILLed (137, "was killed"). Before,
the code depended on which process wrote or died first: 1 or 137 for a killed streamer, and
mpiexec's 9 with no line for a killed wrapper (csrun.launch.task_exits).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import BIN, base_env, follow

SCRIPT = Path(__file__).parent / "scripts" / "failing_task.py"
ROUNDS = 3
pytestmark = pytest.mark.timeout(300)


def run_job(env: dict[str, str], *, kill: str = "") -> tuple[int, str]:
    """One job; ``kill`` ("task" or "wrapper"): SIGKILL that process of rank 1 once the chief steps."""
    pending = [kill] if kill else []

    def on_line(line: str, _proc: subprocess.Popen[str]) -> None:
        if pending and "STEPPING" in line:
            os.kill(rank_1_process(env["CSRUN_EXIT_CODE_JOB"], wrapper=pending.pop() == "wrapper"), signal.SIGKILL)

    return follow([str(BIN / "csrun_wse"), "--total-nodes", "3", str(BIN / "python-pt"), str(SCRIPT)], env, on_line)


def rank_1_process(mark: str, *, wrapper: bool) -> int:
    """The pid of this job's rank-1 task (its main process) or of csrun's wrapper around it."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            env = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            parent_cmdline = (Path("/proc") / (entry / "stat").read_text().rsplit(")", 1)[1].split()[1] / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if b"PMI_RANK=1" not in env or f"CSRUN_EXIT_CODE_JOB={mark}".encode() not in env:
            continue
        is_wrapper = b"csrun.launch.task" in cmdline
        if wrapper and is_wrapper:
            return int(entry.name)
        if not wrapper and str(SCRIPT).encode() in cmdline and b"csrun.launch.task" in parent_cmdline:
            return int(entry.name)  # the task itself (its DataLoader has no worker processes)
    raise AssertionError(f"no rank-1 {'wrapper' if wrapper else 'task'} of job {mark}")


@pytest.mark.parametrize("fail, kill, code, says", [
    ("1:raise:0", "", 1, "exited with code 1"),
    ("1:exit:6", "", 6, "exited with code 6"),
    ("-1:none:0", "task", 137, "exited with code 137"),
    ("-1:none:0", "wrapper", 137, "was killed (code 137; no report from its wrapper)"),
])
def test_the_first_failure_decides_the_code_every_time(no_slurm_env: dict[str, str], fail: str, kill: str, code: int,
                                                       says: str) -> None:
    seen = []
    for i in range(ROUNDS):
        env = {**no_slurm_env, "FAIL": fail, "STEP_SLEEP": "0.05", "CSRUN_EXIT_CODE_JOB": f"{fail}{kill}{i}"}
        got, output = run_job(env, kill=kill)
        lines = [line for line in output.splitlines() if line.startswith("csrun_wse: task rank")]
        seen.append((got, lines))
        assert got == code, f"round {i}: exit {got}, not {code}:\n{output[-3000:]}"
        assert lines and lines[0].startswith("csrun_wse: task rank 1 on ") and says in lines[0], f"round {i}: {lines}"
    print(seen)


def test_a_mistyped_script_is_one_line_naming_rank_node_and_cause(no_slurm_env: dict[str, str], tmp_path: Path) -> None:
    done = subprocess.run([str(BIN / "csrun_wse"), "--total-nodes", "3", str(BIN / "python-pt"), "rnu.py", "--mode", "train"],
                          env=no_slurm_env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stdout + done.stderr, done.stderr  # was: three copies of mpi4py's runpy traceback
    said = [line for line in done.stderr.splitlines() if "rnu.py" in line]
    assert len(said) == 2, done.stderr  # every task fails alike: the chief says it once, the launcher names one
    assert f"python-pt: error: cannot open the script 'rnu.py': no such file (in {tmp_path})" in said
    ended = next(line for line in said if line.startswith("csrun_wse: task rank "))
    assert re.fullmatch(r"csrun_wse: task rank [012] on \S+ exited with code 2 \(cannot open the script 'rnu.py': "
                        r"no such file\); ending the job", ended), ended


def test_a_streamers_traceback_is_labelled_and_its_cause_named(no_slurm_env: dict[str, str]) -> None:
    env = {**no_slurm_env, "FAIL": "1:raise:0", "STEP_SLEEP": "0.05", "CSRUN_EXIT_CODE_JOB": "labelled"}
    code, output = run_job(env)
    assert code == 1, output
    trace = [line for line in output.splitlines() if "Traceback" in line or "RuntimeError: a bug" in line]
    assert trace and all(line.startswith("[rank 1] ") for line in trace if "csrun" not in line), trace
    assert ("exited with code 1 (its input pipeline failed: RuntimeError: a bug in the input pipeline); ending the job"
            in output), output


def test_a_task_whose_wrapper_still_drains_is_not_counted_killed(tmp_path: Path) -> None:
    """The command has ended, its wrapper is still copying its last lines (no report yet): the task
    is not "killed"; once the wrapper reports 0 nothing failed. A wrapper gone without a report is."""
    import socket
    import time as clock

    from csrun.task_exits import KILLED, SETTLE_S, TaskWatch, report_exit

    command = subprocess.Popen(["true"])
    wrapper = subprocess.Popen(["sleep", "30"])
    command.wait()
    namespace = os.readlink("/proc/self/ns/pid")
    (tmp_path / "start.1").write_text(f"{command.pid} {wrapper.pid} {namespace} {socket.gethostname()} vm\n")
    watch = TaskWatch(str(tmp_path))
    try:
        deadline = clock.monotonic() + SETTLE_S * 3
        while clock.monotonic() < deadline:
            watch.wait(0.05)
            assert watch.first_failure() is None  # the command's end alone says nothing yet
        report_exit(str(tmp_path), 1, "vm", 0)
        assert watch.first_failure() is None
        (tmp_path / "exit.1").unlink()
        wrapper.kill()
        wrapper.wait()
        deadline = clock.monotonic() + SETTLE_S * 4
        found = None
        while found is None and clock.monotonic() < deadline:
            watch.wait(0.05)
            found = watch.first_failure()
        assert found is not None and found.code == KILLED and not found.reported, found
    finally:
        watch.close()
        if wrapper.poll() is None:
            wrapper.kill()


def test_a_batch_jobs_first_failure_is_by_the_tasks_own_times(tmp_path: Path) -> None:
    """``python -m csrun.task_exits STATE`` (the batch script's rule): the reports' own times decide,
    not the order the files were written in; a last word counts before its wrapper's report."""
    (tmp_path / "exit.2").write_text("1 cs-w2 200.0 RuntimeError: lost my peer\n")  # written first, ended later
    (tmp_path / "exit.1").write_text("137 cs-w1 150.0\n")
    (tmp_path / "last.1").write_text("9 cs-w1 149.5 SystemExit from the input pipeline\n")
    (tmp_path / "exit.0").write_text("0 cs-chief 100.0\n")
    done = subprocess.run([sys.executable, "-m", "csrun.task_exits", str(tmp_path)], capture_output=True, text=True,
                          timeout=60, env=base_env())
    assert done.returncode == 0, done.stderr
    assert done.stdout == "9\t1\tcs-w1\tSystemExit from the input pipeline\n"
    for f in tmp_path.iterdir():
        f.unlink()
    done = subprocess.run([sys.executable, "-m", "csrun.task_exits", str(tmp_path)], capture_output=True, text=True,
                          timeout=60, env=base_env())
    assert done.returncode == 0 and done.stdout == ""  # no failure: the script keeps srun's code
