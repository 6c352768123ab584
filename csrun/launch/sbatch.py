"""``--use-sbatch``: submit the launcher's command as a Slurm batch job through submitit.

The job runs :class:`CommandJob` on one exclusive node (off the GRES node and the site's
system nodes, as csrun_cpu's interactive path), named as the caller says (csrun_cpu: ``csrun_cpu:<script>``, see
:func:`csrun.launch.srun.job_name`). Logs land in ``<log_dir>/<job id>/`` (submitit's
``<id>_0_log.out`` and ``<id>_0_log.err``, the job's ``StdOut``/``StdErr``); the command's
exit code is written beside them as text, ``<id>_0_exit_code`` (:data:`EXIT_CODE_FILE`). Waiting for the job,
following its log and reading that code is :mod:`csrun.launch.jobs`' (from the job id alone).

submitit learns a job's state from ``sacct``, which needs Slurm accounting; clusters without
it (the local test cluster among them) leave the state UNKNOWN. :class:`SqueueWatcher` asks
``squeue --states=all`` instead, which shows finished jobs for the cluster's MinJobAge.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from csrun.errors import LaunchError, UsageError
from csrun.launch.process import wait_child
from csrun.files import atomic_write
from csrun.launch.preempt_signal import preemption_signal, submitit_signal
from csrun.launch.srun import excluded_nodes
from csrun.site import SiteConfig


def _squeue_classes() -> tuple[type, type]:
    """submitit's SlurmExecutor and SlurmJob with a watcher that reads squeue, not sacct."""
    from submitit.slurm import slurm

    class SqueueWatcher(slurm.SlurmInfoWatcher):
        """Job states from ``squeue --states=all``: works without Slurm accounting."""

        def _make_command(self) -> list[str] | None:
            ids = {x.split("_")[0] for x in self._registered - self._finished}
            if not ids:
                return None
            return ["squeue", "--noheader", "--states=all", "--format=%i|%T|%N", "--jobs=" + ",".join(sorted(ids))]

        def read_info(self, string: bytes | str) -> dict[str, dict[str, str]]:
            text = string.decode() if isinstance(string, bytes) else string
            return super().read_info("JobID|State|NodeList\n" + text)

    class SqueueJob(slurm.SlurmJob):
        watcher = SqueueWatcher(delay_s=2)

    class SqueueExecutor(slurm.SlurmExecutor):
        job_class = SqueueJob

    return SqueueExecutor, SqueueJob


def _ignore_submitit_signal() -> None:
    """In the command's process: submitit's preemption signal is for the job wrapper, not for it
    (unless it is the command's own preemption signal too)."""
    theirs = submitit_signal()
    if theirs != preemption_signal():
        signal.signal(theirs, signal.SIG_IGN)


EXIT_CODE_FILE = "{job_id}_0_exit_code"
"""In the job's log folder: the command's exit code as text (Slurm reports the job COMPLETED with
0 whatever the command returned; submitit's own record of it is a pickle, which csrun never reads)."""


class CommandJob:
    """What the batch job runs: the command, in the submitter's folder and environment.

    Preemption: submitit asks the job for ``--signal=SIG@90`` (SIG: ``SUBMITIT_PREEMPT_SIGNAL``,
    default USR2) and, on that signal, calls :meth:`checkpoint` of a callable that has one,
    then requeues the job. Here that sends ``CSRUN_PREEMPT_SIGNAL`` (default USR1) to the
    command (the runner saves a checkpoint at the next step and stops with ``128 + signal``),
    waits for it, and hands submitit the same command to run again only when it ended with that
    code (else submitit is told not to requeue); the next run sees ``SLURM_RESTART_COUNT`` > 0
    (the job's ``SLURM_*`` variables reach the command) and resumes.
    """

    def __init__(self, log_dir: str = "") -> None:
        self.log_dir = log_dir
        """The ``--log-dir`` whose ``<job id>/`` folder gets :data:`EXIT_CODE_FILE` (``""``: none)."""
        self._child: subprocess.Popen[bytes] | None = None

    def __getstate__(self) -> dict[str, object]:
        return {"log_dir": self.log_dir}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.log_dir = str(state.get("log_dir", ""))
        self._child = None

    def __call__(self, command: list[str], env: dict[str, str], cwd: str) -> int:
        """Run the command to its end; its exit code (also written, as text, beside the job's logs)."""
        job_vars = {k: v for k, v in os.environ.items() if k.startswith("SLURM_")}
        self._child = child = subprocess.Popen(command, env={**env, **job_vars}, cwd=cwd,
                                               preexec_fn=_ignore_submitit_signal)
        # not child.wait(): submitit's signal handler (checkpoint) runs in this thread and waits for
        # the child itself, which a blocking wait() here would lock out (Popen's waitpid lock)
        code = wait_child(child)
        job_id = os.environ.get("SLURM_JOB_ID", "")
        if self.log_dir and job_id:
            try:
                atomic_write(Path(self.log_dir) / job_id / EXIT_CODE_FILE.format(job_id=job_id), f"{code}\n",
                             durable=False)
            except OSError:
                pass  # the job's state still ends it; only `csrun status` lacks the command's own code
        return code

    def checkpoint(self, command: list[str], env: dict[str, str], cwd: str) -> object:
        """On preemption: let the command checkpoint and stop, then ask to run it again."""
        import submitit

        child = self._child
        sig = preemption_signal()
        if child is None or child.poll() is not None:
            return None  # nothing running to checkpoint: nothing to resume
        child.send_signal(sig)
        try:
            code = child.wait(timeout=CHECKPOINT_WAIT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            return None
        if code != 128 + sig:  # it did not checkpoint and stop (or gave up requeueing)
            return None
        return submitit.helpers.DelayedSubmission(CommandJob(self.log_dir), command, env, cwd)


CHECKPOINT_WAIT_S = 60.0
"""How long a preempted command gets to save its checkpoint (submitit signals 90 s before the limit)."""


def time_limit_minutes(text: str) -> int:
    """A Slurm time limit (``MM``, ``HH:MM:SS``, ``D-HH:MM``…) in whole minutes; ``""`` is 0, no limit."""
    if not text:
        return 0
    m = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if not m:
        raise UsageError(f"option --time: {text!r} is not a Slurm time limit (MM, HH:MM:SS or D-HH:MM:SS)")
    days, a, b, c = m.groups()
    if b is None:  # MM, or D-HH
        minutes = int(a) * 60 if days else int(a)
        seconds = 0
    elif c is None:  # MM:SS, or D-HH:MM
        minutes, seconds = (int(a) * 60 + int(b), 0) if days else (int(a), int(b))
    else:  # HH:MM:SS
        minutes, seconds = int(a) * 60 + int(b), int(c)
    return (int(days or 0) * 1440) + minutes + (1 if seconds else 0)


@dataclass(frozen=True, kw_only=True)
class Submission:
    """A submitted batch job: its id and where its logs are."""

    job_id: str
    log_folder: Path


def submit(
    command: list[str],
    env: dict[str, str],
    site: SiteConfig,
    *,
    job_name: str,
    log_dir: str,
    time: str,
    exclude_gres: bool,
) -> Submission:
    """Submit ``command`` as a one-node exclusive batch job; return at once."""
    executor_class, _ = _squeue_classes()
    folder = Path(log_dir).resolve() / "%j"
    executor = executor_class(folder=folder, max_num_timeout=3)
    params: dict[str, object] = dict(
        job_name=job_name,
        time=time_limit_minutes(time),
        nodes=1,
        ntasks_per_node=1,
        cpus_per_task=site.def_cpus_per_task,
        exclusive=True,
    )
    if site.partition:
        params["partition"] = site.partition
    if site.account:
        params["account"] = site.account
    excludes = excluded_nodes(site) if exclude_gres else ""
    if excludes:
        params["exclude"] = excludes
    executor.update_parameters(**params)
    try:
        job = executor.submit(CommandJob(str(Path(log_dir).resolve())), list(command), dict(env), os.getcwd())
    except Exception as exc:  # submitit wraps sbatch failures in several types
        raise LaunchError(f"sbatch refused the job: {str(exc).strip().splitlines()[-1] if str(exc).strip() else exc!r}") from None
    return Submission(job_id=str(job.job_id), log_folder=Path(str(folder).replace("%j", str(job.job_id))))
