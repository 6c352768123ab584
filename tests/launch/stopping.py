"""A csrun_wse job of tests/launch/scripts/stop_task.py, stopped by a signal: what the local and Slurm tests share.

:class:`Job` starts csrun_wse in a layout (a lone chief; the chief and two streamers; a cluster of
two systems, MemoryX and a streamer), its output going to a file (so that a test never waits on
a pipe some leftover process holds), and finds the job's processes by a mark in their
environment. :func:`check_planned_stop` is what every stopped job must show: the code, the
chief's save at the step it reached with every system and MemoryX still serving, no line
that reads as a failure, and nothing left running.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

from tests.conftest import BIN

STOP_TASK = Path(__file__).parent / "scripts" / "stop_task.py"
MARK = "CSRUN_STOP_TEST"
LAYOUTS = {
    "lone chief": (["--total-nodes", "1"], 1),
    "chief and streamers": (["--total-nodes", "3"], 3),
    "cluster": (["--num-csx", "2", "--total-nodes", "5"], 2),
}
"""csrun_wse's layout options, and how many tasks print ``ready`` (a cluster's systems and MemoryX do not)."""
SWARM = {"cluster": [1, 2, 3]}
"""The ranks of the systems and MemoryX, by layout."""
FAILURE_WORDS = ("BAD TERMINATION", "Abort(", "csrun_wse: task rank", "Traceback", "srun: error:")
GONE_WITHIN_S = 5.0


def wait_until(predicate, seconds: float) -> bool:  # type: ignore[no-untyped-def]
    """Whether ``predicate()`` came true within ``seconds``."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _environ(pid: str) -> dict[bytes, bytes]:
    try:
        return dict(item.split(b"=", 1) for item in (Path("/proc") / pid / "environ").read_bytes().split(b"\0")
                    if b"=" in item)
    except (OSError, ValueError):
        return {}


def _cmdline(pid: str) -> bytes:
    try:
        return (Path("/proc") / pid / "cmdline").read_bytes()
    except OSError:
        return b""


class Job:
    """csrun_wse running stop_task.py in ``layout``; output in ``tmp_path/output``, evidence in
    ``tmp_path/out``. As a context manager: whatever of the job is left at the end is killed."""

    def __init__(self, env: dict[str, str], tmp_path: Path, layout: str, *, named: bool = False,
                 save_s: float = 0) -> None:
        """``named``: the job is named by its mark (``--job-name``: Slurm's tools find it by that);
        ``save_s``: how long the chief's save takes."""
        self.mark = uuid.uuid4().hex
        self.layout = layout
        self.out = tmp_path / "out"
        self.log = tmp_path / "output"
        layout_options, self.ready_count = LAYOUTS[layout]
        name = ["--job-name", self.mark] if named else []
        self.env = env
        self.named = named
        argv = [str(BIN / "csrun_wse"), *layout_options, *name, str(BIN / "python-pt"), str(STOP_TASK), str(self.out)]
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(argv, env={**env, MARK: self.mark, "TMPDIR": str(tmp_path),
                                                    "STOP_TASK_SAVE_S": str(save_s)}, cwd=tmp_path,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def __enter__(self) -> "Job":
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill_all()  # what a failed test left (a passed one checked that nothing was)

    @property
    def output(self) -> str:
        return self.log.read_text()

    def wait_ready(self, seconds: float = 120) -> None:
        """Until every task that prints it said ``rank N ready``."""
        ready = wait_until(lambda: self.proc.poll() is not None or len(
            set(re.findall(r"rank (\d+) ready", self.output))) >= self.ready_count, seconds)  # tasks' lines may interleave
        assert ready and self.proc.poll() is None, self.output[-3000:]

    def finish(self, seconds: float = 120) -> int:
        """The launcher's exit code (it is killed, and the test fails, after ``seconds``)."""
        try:
            return self.proc.wait(seconds)
        except subprocess.TimeoutExpired:
            self.kill_all()
            raise AssertionError(f"still running {seconds:g} s after the signal:\n{self.output[-3000:]}") from None

    def processes(self) -> dict[int, bytes]:
        """pid -> command line of every process of this job (by the mark in its environment)."""
        found = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and _environ(entry.name).get(MARK.encode()) == self.mark.encode():
                found[int(entry.name)] = _cmdline(entry.name)
        return found

    def segments(self) -> set[str]:
        """The MPICH segments in /dev/shm that the job's processes map (names)."""
        names = set()
        for pid in self.processes():
            try:
                maps = (Path("/proc") / str(pid) / "maps").read_text().splitlines()
            except OSError:
                continue
            names |= {Path(line.split(None, 5)[-1]).name for line in maps
                      if "/dev/shm/mpich_shm_" in line and not line.endswith("(deleted)")}
        return names

    def tasks(self, *, rank: int | None = None, commands_only: bool = False) -> list[int]:
        """The tasks' processes (their wrappers and commands; ``rank``: of that rank only)."""
        pids = []
        for pid, cmdline in self.processes().items():
            env = _environ(str(pid))
            task_rank = env.get(b"PMI_RANK", env.get(b"SLURM_PROCID"))
            if task_rank is None or (rank is not None and task_rank != str(rank).encode()):
                continue
            if commands_only and b"csrun.launch.task" in cmdline:
                continue
            pids.append(pid)
        return pids

    def signal_tasks(self, sig: int, *, rank: int | None = None, commands_only: bool = False) -> None:
        """Send ``sig`` to the tasks' processes (as Slurm signals every process of a step)."""
        pids = self.tasks(rank=rank, commands_only=commands_only)
        assert pids, f"no task of job {self.mark} to signal"
        for pid in pids:
            os.kill(pid, sig)

    def kill_all(self) -> None:
        """Kill whatever of the job runs (and cancel its Slurm job: a killed srun would leave it allocated)."""
        if self.named:
            subprocess.run(["scancel", f"--name={self.mark}"], env=self.env, capture_output=True, timeout=60)
        for pid in [*self.processes(), self.proc.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def saved(self) -> dict:
        return json.loads((self.out / "saved.json").read_text())


def check_planned_stop(job: Job, code: int, *, said: str = "", failure_words: tuple[str, ...] = FAILURE_WORDS) -> None:
    """The job exited ``code`` after its chief saved at the step it reached, every system and MemoryX
    answering until then; the output holds ``said`` and no line that reads as a failure; nothing is left."""
    text = job.output
    assert job.proc.returncode == code, text[-3000:]
    assert (job.out / "saved.json").exists(), text[-3000:]
    saved = job.saved()
    assert saved["step"] > 0 and saved["answered"] == SWARM.get(job.layout, []), (saved, text[-3000:])
    assert f"at global step {saved['step']}; checkpoint saved" in text, text[-3000:]
    assert said in text, text[-3000:]
    for words in failure_words:
        assert words not in text, f"{words!r} in:\n{text[-3000:]}"
    assert wait_until(lambda: not job.processes(), GONE_WITHIN_S), job.processes()
