"""``--use-sbatch``: submit the launcher's command as a Slurm batch job through submitit.

The job runs :func:`run_command` on one exclusive node (off the GRES node, as csrun_cpu's
interactive path). Logs land in ``<log_dir>/<job id>/`` (submitit's ``<id>_0_log.out`` and
``<id>_0_log.err``). With ``wait`` the caller blocks until the job ends and gets the
command's exit code back.

submitit learns a job's state from ``sacct``, which needs Slurm accounting; clusters without
it (the local test cluster among them) leave the state UNKNOWN, and a job that dies before
writing its result would be waited for forever. :class:`SqueueWatcher` asks ``squeue
--states=all`` instead, which shows finished jobs for the cluster's MinJobAge.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from csrun.errors import LaunchError, UsageError
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


def run_command(command: list[str], env: dict[str, str], cwd: str) -> int:
    """What the batch job runs: the command, in the submitter's folder and environment; its exit code."""
    return subprocess.run(command, env=env, cwd=cwd, check=False).returncode


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
    job: object
    """The submitit Job, for :func:`wait_for`."""


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
    if exclude_gres and site.gres_node:
        params["exclude"] = site.gres_node
    executor.update_parameters(**params)
    try:
        job = executor.submit(run_command, list(command), dict(env), os.getcwd())
    except Exception as exc:  # submitit wraps sbatch failures in several types
        raise LaunchError(f"sbatch refused the job: {str(exc).strip().splitlines()[-1] if str(exc).strip() else exc!r}") from None
    return Submission(job_id=str(job.job_id), log_folder=Path(str(folder).replace("%j", str(job.job_id))), job=job)


def wait_for(submission: Submission) -> int:
    """Block until the job ends; the command's exit code, or 1 when the job itself failed."""
    job = submission.job
    try:
        return int(job.result())  # type: ignore[attr-defined]
    except Exception as exc:
        lines = [line for line in str(exc).splitlines() if line.strip()]
        raise LaunchError(
            f"batch job {submission.job_id} failed: {lines[-1] if lines else exc!r}; logs in {submission.log_folder}"
        ) from None
