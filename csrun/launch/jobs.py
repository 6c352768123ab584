"""A Slurm job after its launcher returned: its state, its log, following it to its end.

What ``csrun status JOBID``, ``csrun logs JOBID [--follow]`` and the launchers' ``--use-sbatch
--wait`` use. Everything is learnt from the job id alone, through ``scontrol --oneliner show
job ID`` (no Slurm accounting needed; Slurm forgets a finished job after its ``MinJobAge``):

* the state (:attr:`JobStatus.state`): Slurm's ``JobState``. A heterogeneous job has one record
  per component: while one has not ended the job's state is the first such component's, once
  all have ended the first that did not complete (else ``COMPLETED``). Asked for a component's
  own id, the whole job is shown;
* the exit code once ended (:attr:`JobStatus.exit_code`): the first non-zero ``ExitCode`` of the
  components (``code:signal``; a signal N reads 128+N), that is the batch script's for
  csrun_wse's job (which exits with the first failed task's own code); for a csrun_cpu job
  (submitit), the command's own code, read from the text file its job writes in the log folder,
  ``<id>_0_exit_code`` (the batch job itself completes with 0 whatever the command returned;
  submitit's ``<id>_0_result.pkl`` is a pickle, never read);
* the log: both launchers' batch jobs point their ``StdOut``/``StdErr`` (which Slurm keeps in
  the job's record, ``%j`` expanded) into the job's log folder ``<log-dir>/<id>/``:
  ``<id>_log.out`` / ``<id>_log.err`` for csrun_wse's heterogeneous job, ``<id>_0_log.out`` /
  ``<id>_0_log.err`` for csrun_cpu's. So the log folder is ``StdOut``'s folder
  (:attr:`JobStatus.log_folder`) and the chief's log is that pair of files: the batch step's
  console, that is the chief's (rank 0) stdout and stderr (without ``--log-dir`` streamers'
  lines reach it too, prefixed ``[rank N]``). An interactive (srun) job has no ``StdOut``: its
  output went to its launcher's console.

:func:`follow` tails the two files (the first onto stdout, the second onto stderr; whole lines,
as they are written, from their start; a file that shrank is read again from its start) until
the job ends, and returns its final :class:`JobStatus`; :func:`final_line` is the line that ends
a ``--wait`` and a ``csrun logs --follow``: ``csrun_wse: job 1234 COMPLETED, exit code 0``.
A job id Slurm does not know (never was, or forgotten after ``MinJobAge``) is an
:class:`UnknownJob`, one line and exit 1 from the commands.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable

from csrun.errors import LaunchError, UsageError
from csrun.launch.sbatch import EXIT_CODE_FILE

FINISHED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                      "DEADLINE", "PREEMPTED"})
"""Slurm job states after which a job runs no more (a requeued job passes through PENDING instead)."""
SCONTROL_RETRY_S = 60.0
"""How long :func:`follow` keeps asking a controller that does not answer before it gives up."""
CHUNK = 1 << 20
"""Bytes a log tail reads at a time."""
_KEY = re.compile(r"^([A-Za-z][A-Za-z0-9_/:]*)=(.*)$")


class UnknownJob(LaunchError):
    """A job id Slurm does not know (exit 1)."""


@dataclass(frozen=True, kw_only=True)
class JobStatus:
    """A Slurm job as ``scontrol show job`` tells it (the module manual says how each is read)."""

    job_id: str
    name: str
    state: str
    exit_code: int | None
    """Once the job ended: its exit code (a csrun_cpu job's: the command's); None before."""
    nodes: str
    """The nodes it holds or held (a heterogeneous job's components joined with ``,``); "" before it starts."""
    elapsed: str
    """Slurm's ``RunTime`` (``HH:MM:SS``, or ``D-HH:MM:SS``)."""
    reason: str
    """Why it waits (``Resources``, ``Priority``...); "" when it does not."""
    restarts: int
    log_folder: Path | None
    """The job's log folder (StdOut's folder); None for an interactive job."""
    stdout: Path | None
    stderr: Path | None

    @property
    def ended(self) -> bool:
        """True once the job runs no more."""
        return self.state in FINISHED

    def as_dict(self) -> dict[str, object]:
        """The fields as plain JSON values."""
        return {"job_id": self.job_id, "name": self.name, "state": self.state, "exit_code": self.exit_code,
                "nodes": self.nodes, "elapsed": self.elapsed, "reason": self.reason, "restarts": self.restarts,
                "log_folder": str(self.log_folder) if self.log_folder else None,
                "stdout": str(self.stdout) if self.stdout else None, "stderr": str(self.stderr) if self.stderr else None}


def parse_show_job(text: str) -> list[dict[str, str]]:
    """``scontrol --oneliner show job``'s output: one ``{field: value}`` per line (component).
    A word without ``=`` continues the value before it (a path with a space)."""
    records = []
    for line in text.splitlines():
        record: dict[str, str] = {}
        key = ""
        for word in line.split():
            m = _KEY.match(word)
            if m:
                key = m.group(1)
                record[key] = m.group(2)
            elif key:
                record[key] += " " + word
        if record.get("JobId"):
            records.append(record)
    return records


def _code(text: str) -> int:
    """``ExitCode`` (``code:signal``) as one number: the code, else 128 + the signal, else 0."""
    status, _, sig = text.partition(":")
    try:
        return int(status) if int(status) else (128 + int(sig) if sig and int(sig) else 0)
    except ValueError:
        return 1


def _path(value: str | None) -> Path | None:
    return Path(value) if value and value != "(null)" else None


def _job_state(records: list[dict[str, str]]) -> str:
    states = [r.get("JobState", "UNKNOWN") for r in records]
    running = [s for s in states if s not in FINISHED]
    if running:
        return running[0]
    return next((s for s in states if s != "COMPLETED"), "COMPLETED")


def status_from_records(records: list[dict[str, str]], job_id: str) -> JobStatus:
    """The :class:`JobStatus` of job ``job_id`` from its parsed records (component 0 first)."""
    if not records:
        raise UnknownJob(f"no job {job_id} known to Slurm")
    records = sorted(records, key=lambda r: int(r.get("HetJobOffset", "0") or 0))
    first = records[0]
    state = _job_state(records)
    stdout, stderr = _path(first.get("StdOut")), _path(first.get("StdErr"))
    folder = stdout.parent if stdout else None
    exit_code: int | None = None
    if state in FINISHED:
        exit_code = next((c for c in (_code(r.get("ExitCode", "0:0")) for r in records) if c), 0)
        command_code = command_exit_code(folder, first.get("HetJobId") or first["JobId"]) if folder else None
        if command_code is not None:
            exit_code = command_code
    nodes = [r.get("NodeList", "") for r in records]
    reason = first.get("Reason", "")
    return JobStatus(
        job_id=first.get("HetJobId") or first["JobId"], name=first.get("JobName", ""), state=state, exit_code=exit_code,
        nodes=",".join(n for n in nodes if n and n != "(null)"), elapsed=first.get("RunTime", ""),
        reason="" if reason in ("", "None") else reason, restarts=int(first.get("Restarts", "0") or 0),
        log_folder=folder, stdout=stdout, stderr=stderr,
    )


def command_exit_code(folder: Path, job_id: str) -> int | None:
    """A csrun_cpu job's command's exit code, from the text file its job leaves in ``folder``
    (:data:`csrun.launch.sbatch.EXIT_CODE_FILE`); None when there is none or it holds no number."""
    try:
        text = (folder / EXIT_CODE_FILE.format(job_id=job_id)).read_text(errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.lstrip("-").isdigit() and len(text) < 6 else None


def check_job_id(text: str) -> str:
    """``text`` as a job id (digits, or ``ID+OFFSET`` of a component: the whole job is meant)."""
    job_id = text.strip().split("+", 1)[0]
    if not job_id.isdigit():
        raise UsageError(f"{text!r} is not a Slurm job id (a number, as sbatch and squeue print it)")
    return job_id


def _show_job(job_id: str) -> str:
    try:
        done = subprocess.run(["scontrol", "--oneliner", "show", "job", job_id], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise LaunchError("scontrol is not on PATH: no Slurm here to ask about a job") from None
    except subprocess.TimeoutExpired:
        raise LaunchError("scontrol show job did not answer within 60 s") from None
    if done.returncode != 0:
        why = (done.stderr or done.stdout).strip()
        if "Invalid job id" in why:
            raise UnknownJob(f"no job {job_id} known to Slurm (a finished job is forgotten after the cluster's MinJobAge; "
                             f"its logs stay in <log-dir>/{job_id}/)")
        raise LaunchError(f"scontrol show job {job_id} failed: {why.splitlines()[-1] if why else done.returncode}")
    return done.stdout


def job_status(job_id: str) -> JobStatus:
    """Job ``job_id``'s :class:`JobStatus` now; :class:`UnknownJob` when Slurm does not know it."""
    job_id = check_job_id(job_id)
    records = parse_show_job(_show_job(job_id))
    het = records[0].get("HetJobId", "") if records else ""
    if het and het != job_id:  # a component's own id: show the whole job
        job_id = het
        records = parse_show_job(_show_job(job_id))
    return status_from_records(records, job_id)


class LogTail:
    """One log file read as it grows: whole lines only, until :meth:`pump` is told the end came."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self._partial = b""

    def pump(self, out: IO[str], *, final: bool = False) -> bool:
        """Copy what was added since the last call onto ``out`` (the last unended line only when
        ``final``); True when the file exists."""
        try:
            size = self.path.stat().st_size
        except OSError:
            return False
        if size < self.offset:  # truncated (a requeued job's log opened anew): from its start again
            self.offset, self._partial = 0, b""
        if size > self.offset:
            try:
                with open(self.path, "rb") as f:
                    f.seek(self.offset)
                    while chunk := f.read(CHUNK):
                        self.offset += len(chunk)
                        data = self._partial + chunk
                        cut = data.rfind(b"\n") + 1
                        self._partial = data[cut:]
                        _write(out, data[:cut])
            except OSError:
                return False
        if final and self._partial:
            _write(out, self._partial + b"\n")
            self._partial = b""
        return True


def _write(out: IO[str], data: bytes) -> None:
    if data:
        out.write(data.decode("utf-8", errors="replace"))
        out.flush()


def _status_retrying(job_id: str, sleep: Callable[[float], None]) -> JobStatus:
    """:func:`job_status`, asking again for :data:`SCONTROL_RETRY_S` while the controller does not answer."""
    deadline = time.monotonic() + SCONTROL_RETRY_S
    while True:
        try:
            return job_status(job_id)
        except UnknownJob:
            raise
        except LaunchError:
            if time.monotonic() > deadline:
                raise
            sleep(2.0)


def follow(job_id: str, *, out: IO[str] | None = None, err: IO[str] | None = None, poll_s: float = 1.0,
           sleep: Callable[[float], None] = time.sleep) -> JobStatus:
    """Tail the job's log (StdOut onto ``out``, StdErr onto ``err``; default this process's
    stdout and stderr) from its start until the job ends; its final :class:`JobStatus`."""
    status = job_status(job_id)
    tails: dict[Path, LogTail] = {}
    while True:
        for path, stream in ((status.stdout, out or sys.stdout), (status.stderr, err or sys.stderr)):
            if path is not None:
                tails.setdefault(path, LogTail(path)).pump(stream, final=status.ended)
        if status.ended:
            return status
        sleep(poll_s)
        status = _status_retrying(status.job_id, sleep)


def final_line(prog: str, status: JobStatus) -> str:
    """``<prog>: job ID STATE, exit code N`` (no exit code before the job ended)."""
    if status.exit_code is None:
        return f"{prog}: job {status.job_id} {status.state}"
    return f"{prog}: job {status.job_id} {status.state}, exit code {status.exit_code}"


def exit_code_of(status: JobStatus) -> int:
    """What a command that waited for the job exits with: the job's exit code, and 1 for a job
    that did not complete with code 0 (cancelled, timed out, node failure)."""
    code = status.exit_code or 0
    return code if code or status.state == "COMPLETED" else 1


def follow_hint(job_id: str) -> str:
    """The line a launcher prints after submitting without ``--wait``."""
    return f"Follow it: csrun status {job_id}; csrun logs {job_id} --follow (scancel {job_id} stops it)"


def wait_and_report(prog: str, job_id: str, say: Callable[[str], None]) -> int:
    """A launcher's ``--wait``: stream the job's log until it ends, ``say`` :func:`final_line`,
    and return :func:`exit_code_of`. Ctrl-C stops the following (exit 130), not the job."""
    try:
        status = follow(job_id)
    except KeyboardInterrupt:
        print(f"{prog}: stopped following job {job_id}; it goes on. {follow_hint(job_id)}", file=sys.stderr, flush=True)
        return 130
    say(final_line(prog, status))
    return exit_code_of(status)
