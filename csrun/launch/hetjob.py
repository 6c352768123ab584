"""``csrun_wse --use-sbatch``: the legacy step shape as a heterogeneous Slurm batch job.

submitit cannot describe a heterogeneous job, so this module writes the batch script itself:
one ``#SBATCH`` block per component of the :class:`~csrun.launch.layout.Layout` separated
by ``#SBATCH hetjob``, and a body that runs the step over every component
(``srun ... --het-group=0 CMD : --het-group=1 ... CMD``). A cluster of N > 1 systems
(``--num-csx N``) has the same components as its srun step (:func:`csrun.launch.layout.cluster_layout`:
the chief, the systems with the GRES each, MemoryX, the streamers), with the same excludes
(:func:`csrun.launch.srun.component_excludes`); the script's environment carries ``CSRUN_NUM_CSX``.

Preemption: with a lead time the job asks for ``--signal=B:SIG@LEAD`` and ``--requeue``, SIG
being ``CSRUN_PREEMPT_SIGNAL`` (default USR1, see :mod:`csrun.launch.preempt_signal`). The
script traps SIG (sent before the time limit, or by ``scancel --signal=SIG --batch JOB``),
forwards it to the step (srun passes it to every task: the runner on the chief checkpoints at
the next step boundary and stops with exit code ``128 + SIG``; streamers ignore it), waits for
the step to end, and puts the job back in the queue (``scontrol requeue``) only when the run
asked for it by writing its step to ``CSRUN_REQUEUE_FILE`` (``<log_dir>/<job id>/.requeue.<restart>``,
set by the script; see :mod:`csrun.run.preemption`): a command that did not checkpoint (killed
by the signal, which also exits ``128 + SIG``), or a runner preempted
``CSRUN_MAX_IDLE_REQUEUES`` times in a row without gaining a step, is not requeued. The next run sees ``SLURM_RESTART_COUNT`` > 0 and the runner resumes from the
latest checkpoint. Every task runs under :mod:`csrun.launch.task`, which writes its command's exit code into
``<log_dir>/<job id>/.tasks.<restart>/``; the script exits with the first failed task's own
code (naming its rank and node), not srun's 137/143. Logs
are opened in append mode so both runs stay in one file. The job is submitted held, its log
folder ``<log_dir>/<job id>/`` is made, and then it is released, so logs land beside
csrun_cpu's (``<id>_log.out`` / ``<id>_log.err``: the job's ``StdOut``/``StdErr``, by which
:mod:`csrun.launch.jobs` finds the folder from the job id alone). The job is named
``csrun_wse:<script>`` (:func:`csrun.launch.srun.job_name`) unless the user named it. Waiting
for it and following its log is :mod:`csrun.launch.jobs`' (``scontrol show job``: no Slurm
accounting needed).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from csrun.errors import LaunchError
from csrun.launch.layout import Layout
from csrun.launch.preempt_signal import preemption_signal
from csrun.launch.sbatch import time_limit_minutes
from csrun.launch.srun import WSE_STEP_FLAGS, component_excludes
from csrun.launch.supervisor import task_command
from csrun.site import SiteConfig


TASK_CODES = """\
export CSRUN_JOB_STATE={log_dir}/"$SLURM_JOB_ID/.tasks.${{SLURM_RESTART_COUNT:-0}}"
mkdir -p "$CSRUN_JOB_STATE"
csrun_task_code() {{  # the first failed task's own exit code (srun reports 137/143 for the tasks it ended), or a planned stop's
    local found code rank node cause
    found=$({python} -m csrun.task_exits "$CSRUN_JOB_STATE" 2>/dev/null)
    rm -rf "$CSRUN_JOB_STATE"
    if [ -n "$found" ]; then
        IFS=$'\\t' read -r code rank node cause <<< "$found"
        [ -n "$rank" ] && echo "csrun: task rank $rank on $node exited with code $code${{cause:+ ($cause)}}" >&2
        echo "$code"
    else
        echo "$1"
    fi
}}
"""
"""Every task runs under csrun.launch.task, which writes its command's exit code here; the job
exits with the first failed task's own code, by the supervisor's rule (``python -m
csrun.task_exits``: the reports' and last words' own times, not file times), or with a planned
stop's code (a preempted run that saved its checkpoint), naming no task."""

PLAIN_BODY = """\
{step}
rc=$(csrun_task_code $?)
exit "$rc"
"""

PREEMPTION_BODY = """\
preempted=0
step=""
export CSRUN_REQUEUE_FILE={log_dir}/"$SLURM_JOB_ID/.requeue.${{SLURM_RESTART_COUNT:-0}}"
rm -f "$CSRUN_REQUEUE_FILE"
on_preempt() {{
    preempted=1
    echo "csrun: SIG{sig}: asking the step to checkpoint and stop" >&2
    [ -n "$step" ] && kill -{sig} "$step" 2>/dev/null
}}
trap on_preempt {sig}

{step} &
step=$!
while :; do
    wait "$step"; rc=$?
    kill -0 "$step" 2>/dev/null || break
done
rc=$(csrun_task_code "$rc")
if [ "$preempted" = 1 ]; then
    if [ -s "$CSRUN_REQUEUE_FILE" ]; then
        echo "csrun: requeueing job $SLURM_JOB_ID to resume from its checkpoint (global step $(cat "$CSRUN_REQUEUE_FILE"))" >&2
        rm -f "$CSRUN_REQUEUE_FILE"
        scontrol requeue "$SLURM_JOB_ID" && exit 0
    fi
    echo "csrun: not requeueing job $SLURM_JOB_ID: the step (exit code $rc) did not report a preemption checkpoint in $CSRUN_REQUEUE_FILE" >&2
fi
exit "$rc"
"""


def hetjob_script(
    command: list[str], layout: Layout, site: SiteConfig, *, job_name: str, log_dir: Path, time: str, cwd: str,
    preempt_lead: int = 0,
) -> str:
    """The batch script for ``command`` over ``layout`` (one component: a plain job).

    ``preempt_lead`` > 0: checkpoint and requeue on the preemption signal
    (:func:`~csrun.launch.preempt_signal.preemption_signal`), asked for that many seconds
    before the time limit.
    """
    sig = preemption_signal()
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job_name}", f"#SBATCH --output={log_dir}/%j/%j_log.out", f"#SBATCH --error={log_dir}/%j/%j_log.err"]
    lines.append(f"#SBATCH --chdir={cwd}")
    minutes = time_limit_minutes(time)
    if minutes:
        lines.append(f"#SBATCH --time={minutes}")
    if preempt_lead:
        lines += [f"#SBATCH --signal=B:{sig.name[3:]}@{preempt_lead}", "#SBATCH --requeue", "#SBATCH --open-mode=append"]
    step: list[str] = ["srun", *WSE_STEP_FLAGS]
    last = len(layout.components) - 1
    for i, c in enumerate(layout.components):
        if i:
            lines.append("#SBATCH hetjob")
        opts = [f"--nodes={c.nodes}", f"--ntasks-per-node={c.tasks_per_node}", f"--cpus-per-task={c.cpus_per_task}"]
        if site.partition:
            opts.append(f"--partition={site.partition}")
        if site.account:
            opts.append(f"--account={site.account}")
        if c.gres and site.gres_resource:
            opts.append(f"--gres={site.gres_resource}")
        if c.worker or c.systems or len(layout.components) == 1:
            opts.append("--exclusive")
        excludes = component_excludes(c, site, layout)
        if excludes:
            opts.append(f"--exclude={excludes}")
        lines += [f"#SBATCH {o}" for o in opts]
        if len(layout.components) > 1:
            if i:
                step.append(":")
            step.append(f"--het-group={i}")
        if c.worker and i == last and layout.cyclic:
            step.append("--distribution=cyclic")
        step += task_command(command)
    if layout.num_csx > 1:
        lines += ["", f"# one step over every component: the chief (rank 0) on the GRES node, the {layout.num_csx} systems "
                      f"(ranks 1-{layout.num_csx}), MemoryX (rank {layout.num_csx + 1}), the streamers after it"]
    else:
        lines += ["", "# one step over every component: the chief (rank 0) on the GRES node, the streamers after it"]
    quoted_dir = shlex.quote(str(log_dir))
    lines.append(TASK_CODES.format(log_dir=quoted_dir, python=shlex.quote(sys.executable)))
    if preempt_lead:
        lines.append(PREEMPTION_BODY.format(step=shlex.join(step), sig=sig.name[3:], log_dir=quoted_dir))
    else:
        lines.append(PLAIN_BODY.format(step=shlex.join(step)))
    return "\n".join(lines)


@dataclass(frozen=True, kw_only=True)
class HetSubmission:
    """A submitted heterogeneous job: its id and log folder."""

    job_id: str
    log_folder: Path


def _run(argv: list[str], what: str, stdin: str | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60, env=env)
    if done.returncode != 0:
        raise LaunchError(f"{what} failed: {(done.stderr or done.stdout).strip()}")
    return done.stdout


def submit_hetjob(script: str, env: dict[str, str], log_dir: Path) -> HetSubmission:
    """Submit ``script`` held (its tasks get ``env``), make its log folder, release it."""
    job_id = _run(["sbatch", "--parsable", "--hold"], "sbatch", stdin=script, env=env).strip().split(";")[0]
    folder = log_dir / job_id
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "job.sbatch").write_text(script)
    _run(["scontrol", "release", job_id], "scontrol release")
    return HetSubmission(job_id=job_id, log_folder=folder)
