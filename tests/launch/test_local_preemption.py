"""A preemption signal sent to the launcher itself, without Slurm: the chief checkpoints and the job stops with 128 + signal.

Batch schedulers other than Slurm's own signal (submitit's wrapper, a site's epilogue, a user's
``kill -USR1``) reach the launcher's process, not the tasks. csrun_wse (local mode: the
supervisor signals mpiexec's process group) and csrun_cpu (the signal is passed on child by
child) must carry it to the training script, with and without ``--log-dir`` (whose task
wrappers have log-pump threads that the kernel may hand the signal to). The model_dir then
holds the checkpoint of the step the run stopped at, and the next run resumes from it.
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import BIN, REPO, long_debug_params
from tests.launch.stopping import FAILURE_WORDS

pytestmark = pytest.mark.timeout(300)


class Console:
    """A running command's merged output, read on a thread so its pipe never fills."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(argv, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def wait_for(self, words: str, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while words not in self.text:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                raise AssertionError(f"no {words!r} in the output:\n{self.text[-3000:]}")
            time.sleep(0.2)

    def finish(self, seconds: float) -> int:
        try:
            code = self.proc.wait(seconds)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"still running {seconds:g} s after the signal:\n{self.text[-3000:]}") from None
        self._reader.join(10)
        return code


LAUNCHES = {
    "csrun_wse, 2 tasks": ["csrun_wse", "--total-nodes", "2"],
    "csrun_wse, 2 tasks, --log-dir": ["csrun_wse", "--total-nodes", "2", "--log-dir", "{logs}"],
    "csrun_cpu": ["csrun_cpu"],
    "csrun_cpu, --log-dir": ["csrun_cpu", "--log-dir", "{logs}"],
}


@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_sigusr1_to_the_launcher_checkpoints_and_stops(no_slurm_env: dict[str, str], tmp_path: Path, launch: str) -> None:
    params, params_file = long_debug_params(tmp_path)
    md = tmp_path / "md"
    words = [w.format(logs=tmp_path / "logs") for w in LAUNCHES[launch]]
    argv = [str(BIN / words[0]), *words[1:], str(BIN / "python-pt"), str(REPO / "models" / "fc_mnist" / "run.py"),
            "--mode", "train", "--params", str(params_file)]
    env = {**no_slurm_env, "OMP_NUM_THREADS": "1"}
    job = Console(argv + ["-o", str(md)], env)
    job.wait_for("Train: step", 150)
    job.proc.send_signal(signal.SIGUSR1)
    code = job.finish(120)
    assert code == 128 + signal.SIGUSR1, job.text[-3000:]
    saved = [int(p.stem.split("_")[1]) for p in md.glob("checkpoint_*.mdl")]
    assert len(saved) == 1 and 0 < saved[0] < params["runconfig"]["max_steps"], job.text[-3000:]
    assert f"stopped by SIGUSR1 at global step {saved[0]}; checkpoint saved" in job.text
    for words in FAILURE_WORDS:  # a planned stop (was: "csrun_wse: task rank 0 ... exited with code 138", Abort(138))
        assert words not in job.text, f"{words!r} in:\n{job.text[-3000:]}"
