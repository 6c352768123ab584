"""A cluster of N systems trains as one system at N times the batch (issue 35), run as a user runs it.

fc_mnist's run.py through ``csrun_wse --num-csx 2`` (locally: mpiexec runs the chief, the two
systems and MemoryX, the task wrapper starting ``python -m csrun.emulator.swarm.task`` on those
three, and the streamers). Checked: the losses of every step and the final checkpoint's weights
equal one system's at batch N·B up to the reduction order's rounding (tests/reduction_order.py); a checkpoint resumed at the same N continues
bit-identically; a system killed mid-step ends the whole job, named, with nothing left running,
and ``--resume`` continues; what the cluster cannot run is refused in one line (pipelined mode,
eval, a count that is not the job's).
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from csrun.mdl import read_mdl, write_mdl
from tests.conftest import BIN, REPO, base_env, follow
from tests.reduction_order import ROUNDING_BOUND

RUN_PY = REPO / "models" / "fc_mnist" / "run.py"
DEBUG_YAML = REPO / "configs" / "fc_mnist_debug.yaml"
pytestmark = pytest.mark.timeout(2400)  # a deadline for a hang only: a busy machine takes its time


def params(tmp: Path, batch: int, **runconfig: int) -> Path:
    """fc_mnist_debug at ``batch`` with ``runconfig`` keys changed."""
    data = yaml.safe_load(DEBUG_YAML.read_text())
    data["train_input"]["batch_size"] = batch
    data["runconfig"].update(runconfig)
    path = tmp / f"fc_{batch}_{'_'.join(f'{k}{v}' for k, v in runconfig.items())}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def run_py(config: Path, model_dir: Path, *extra: str) -> list[str]:
    """run.py on the system path in weight-streaming mode."""
    return [sys.executable, str(RUN_PY), "--mode", "train", "--params", str(config), "-o", str(model_dir),
            "--execution_strategy", "weight_streaming", *extra]


def cluster_argv(command: list[str], *, streamers: int) -> list[str]:
    """``csrun_wse --num-csx 2`` with ``streamers`` streamer tasks (one streamer node)."""
    return [str(BIN / "csrun_wse"), "--num-csx", "2", "--total-nodes", "5", "--tasks-per-node", str(streamers),
            *command]


def cluster(command: list[str], env: dict[str, str], *, streamers: int) -> subprocess.CompletedProcess[str]:
    """``command`` as the chief and the streamers of a local job of 2 systems and MemoryX."""
    return subprocess.run(cluster_argv(command, streamers=streamers), env={**env, "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=900, cwd=REPO)


def alone(command: list[str]) -> subprocess.CompletedProcess[str]:
    """``command`` as a lone chief on one system (the embedded emulator)."""
    return subprocess.run([*command, "--cs_ip", "embedded"], env={**base_env(), "OMP_NUM_THREADS": "1"},
                          capture_output=True, text=True, timeout=900, cwd=REPO)


def ok(done: subprocess.CompletedProcess[str]) -> None:
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def losses(model_dir: Path) -> dict[int, float]:
    with open(model_dir / "losses" / "losses.csv") as f:
        return {int(row["step"]): float(row["loss"]) for row in csv.DictReader(f)}


def weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return read_mdl(checkpoint)["model"]


def largest_relative(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-30)) for k in a)


def test_two_systems_train_as_one_at_twice_the_batch(tmp_path: Path, no_slurm_env: dict[str, str]) -> None:
    ok(one := alone(run_py(params(tmp_path, 128), tmp_path / "one", "--max_steps", "100")))
    ok(two := cluster(run_py(params(tmp_path, 64), tmp_path / "two", "--max_steps", "100"), no_slurm_env,
                      streamers=2))
    assert "streaming from 2 streamer(s)" in two.stdout  # the input group: the chief and its streamers
    a, b = losses(tmp_path / "one"), losses(tmp_path / "two")
    assert sorted(a) == sorted(b) == list(range(1, 101))
    worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in a)
    assert worst <= ROUNDING_BOUND, worst
    assert a != {s: a[1] for s in a}  # it trained
    rel = largest_relative(weights(tmp_path / "two" / "checkpoint_100.mdl"),
                           weights(tmp_path / "one" / "checkpoint_100.mdl"))
    assert rel <= ROUNDING_BOUND, rel
    for model_dir in ("one", "two"):  # the cluster's samples: 100 steps x 2 systems x 64
        summary = json.loads((tmp_path / model_dir / "performance" / "train" / "summary.json").read_text())
        assert summary["samples"] == 12800 and summary["end_step"] == 100, summary
        assert json.loads((tmp_path / model_dir / "performance" / "performance.json").read_text())["total_samples"] \
            == 12800
    assert "(12800 samples" in two.stdout and "(12800 samples" in one.stdout


def test_every_checkpoint_resumes_bit_identically_at_the_same_n(tmp_path: Path, no_slurm_env: dict[str, str]) -> None:
    """Batches of 287: an epoch of the digits is 5 of them, 2 steps of 2 systems and one batch left out.
    A checkpoint every step: at step 1 mid-epoch (data position 2), at step 2 the epoch's tail (position 5,
    the next epoch's first batch: past the batch left out), at step 3 in the next epoch (5 + 2). Resumed from
    each, the run trains what the uninterrupted one did, bit for bit; so does step 2's checkpoint recording
    the batches taken (4), as a loader of unknown epoch length records them (an IterableDataset's, GPT-2's)
    and as checkpoints written before the tail was skipped did (issue 45 item 1)."""
    config, whole = params(tmp_path, 287, checkpoint_steps=1), tmp_path / "whole"
    ok(cluster(run_py(config, whole, "--max_steps", "3"), no_slurm_env, streamers=1))
    assert [read_mdl(whole / f"checkpoint_{s}.mdl")["data_position"] for s in (1, 2, 3)] == [2, 5, 7]
    for step, position in ((1, None), (2, None), (2, 4)):
        parts = tmp_path / f"from_{step}_at_{position}"  # the run that stopped at `step`
        parts.mkdir()
        for compiled in whole.glob("cs_*"):  # its compile folder, as that run left it: no compile again
            shutil.copytree(compiled, parts / compiled.name)
        state = read_mdl(whole / f"checkpoint_{step}.mdl")
        if position is not None:
            state["data_position"] = position
        write_mdl(parts / f"checkpoint_{step}.mdl", state)
        ok(resumed := cluster(run_py(config, parts, "--max_steps", "3", "--resume"), no_slurm_env, streamers=1))
        assert f"checkpoint_{step}.mdl at global step {step}" in resumed.stdout + resumed.stderr
        assert losses(parts) == {s: losses(whole)[s] for s in range(step + 1, 4)}, (step, position)  # bitwise
        assert largest_relative(weights(parts / "checkpoint_3.mdl"), weights(whole / "checkpoint_3.mdl")) == 0.0


def test_pipelined_mode_is_refused_in_one_line(tmp_path: Path, no_slurm_env: dict[str, str]) -> None:
    done = cluster(run_py(params(tmp_path, 64), tmp_path / "md", "--max_steps", "5", "--execution_strategy",
                          "pipeline"), no_slurm_env, streamers=1)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    for word in ("num_csx 2", "weight-streaming mode only", "python-ws"):
        assert word in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and not (tmp_path / "md" / "checkpoint_5.mdl").exists()


@pytest.mark.parametrize("argv, job, words", [
    (["-m", "train", "--num_csx", "3"], 2, ("runconfig.num_csx is 3", "this job has 2 system(s)", "--num-csx 3")),
    (["-m", "train", "--num_csx", "2"], 1, ("runconfig.num_csx is 2", "this job has 1 system(s)", "--num-csx 2")),
    (["-m", "eval"], 2, ("--mode eval with num_csx 2", "eval runs on one system", "without --num-csx")),
    (["-m", "eval_all"], 2, ("eval runs on one system",)),
])
def test_what_a_cluster_cannot_run_names_the_fix(argv: list[str], job: int, words: tuple[str, ...]) -> None:
    from csrun.run.cli_args import RunPath, check_num_csx, load_params, parse_args
    from csrun.typed_config import ConfigError
    from tests.run.conftest import fc_mnist_model_module

    module = fc_mnist_model_module()
    given = load_params(parse_args(["-p", str(DEBUG_YAML), "--execution_strategy", "weight_streaming", *argv],
                                   environ={}), default_model_dir="/md", model_config=module.FcMnistConfig,
                        input_config=module.FcMnistInputConfig)
    with pytest.raises(ConfigError) as exc:
        check_num_csx(given, RunPath(kind="system", cs_ip=None, reason="test"), job_systems=job)
    assert all(word in str(exc.value) for word in words), str(exc.value)


def test_the_job_s_count_is_taken_and_the_cpu_path_trains_batch_size(capsys: pytest.CaptureFixture[str]) -> None:
    from csrun.run.cli_args import RunPath, check_num_csx, load_params, parse_args
    from tests.run.conftest import fc_mnist_model_module

    module = fc_mnist_model_module()

    def given(*argv: str):  # noqa: ANN202 - the params of run.py's flags
        return load_params(parse_args(["-p", str(DEBUG_YAML), "-m", "train", "--execution_strategy",
                                       "weight_streaming", *argv], environ={}),
                           default_model_dir="/md", model_config=module.FcMnistConfig,
                           input_config=module.FcMnistInputConfig)

    taken = given()
    check_num_csx(taken, RunPath(kind="system", cs_ip=None, reason="test"), job_systems=2)
    assert taken.runconfig.num_csx == 2  # recorded in params_train.yaml as what ran
    on_cpu = given("--num_csx", "4")
    check_num_csx(on_cpu, RunPath(kind="cpu", cs_ip=None, reason="test"), job_systems=1)
    assert "num_csx 4 is the system's: this CPU run trains one stream of batches of batch_size" in capsys.readouterr().out
    check_num_csx(given(), RunPath(kind="cpu", cs_ip=None, reason="test"), job_systems=2)  # --cpu in a cluster's job
    said = capsys.readouterr().out
    assert "num_csx 2 is the system's" in said and "(the job's 2 system tasks stay idle)" in said


def swarm_tasks(marker: str) -> dict[int, int]:
    """rank -> pid of this test's running system and MemoryX tasks (found by ``marker`` in their environment)."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if b"csrun.emulator.swarm.task" not in (entry / "cmdline").read_bytes():
                continue
            env = dict(item.split(b"=", 1) for item in (entry / "environ").read_bytes().split(b"\0") if b"=" in item)
        except (OSError, ValueError):
            continue
        if env.get(b"CLUSTER_TEST_MARK") == marker.encode():
            found[int(env[b"PMI_RANK"])] = int(entry.name)
    return found


def none_left(mark: str) -> bool:
    """Whether the job's swarm tasks are gone (a killed job's tasks are reaped a moment after it
    ends: looked for until a deadline that only a task left running reaches)."""
    deadline = time.monotonic() + 60
    while swarm_tasks(mark) and time.monotonic() < deadline:
        time.sleep(0.2)
    return swarm_tasks(mark) == {}


def test_a_system_killed_mid_step_ends_the_job_naming_it_and_resume_continues(
        tmp_path: Path, no_slurm_env: dict[str, str]) -> None:
    config, model_dir = params(tmp_path, 64, log_steps=1), tmp_path / "md"
    env = {**no_slurm_env, "OMP_NUM_THREADS": "1", "CLUSTER_TEST_MARK": str(tmp_path)}
    killed: list[float] = []

    def kill_a_system(line: str, _proc: subprocess.Popen[str]) -> None:
        if not killed and (model_dir / "checkpoint_40.mdl").exists():
            pids = swarm_tasks(str(tmp_path))
            assert sorted(pids) == [1, 2, 3], pids
            os.kill(pids[1], signal.SIGKILL)
            killed.append(time.monotonic())

    code, out = follow(cluster_argv(run_py(config, model_dir, "--max_steps", "100000", "--checkpoint_steps", "20"),
                                    streamers=1),
                       env, kill_a_system, timeout=600, cwd=REPO)
    ended = time.monotonic()
    assert killed, out[-3000:]
    print(f"the job ended {ended - killed[0]:.1f} s after the kill")
    assert code == 137, out[-3000:]
    assert "task rank 1 (system 1 of 2) on" in out, out[-3000:]
    assert none_left(str(tmp_path))  # nothing left running
    last = max(int(p.stem.split("_")[1]) for p in model_dir.glob("checkpoint_*.mdl"))
    assert last >= 40
    resumed = cluster(run_py(config, model_dir, "--max_steps", str(last + 10), "--resume"), env, streamers=1)
    ok(resumed)
    assert f"checkpoint_{last}.mdl" in resumed.stdout + resumed.stderr
    assert (model_dir / f"checkpoint_{last + 10}.mdl").exists()


def test_a_system_that_cannot_build_its_engine_is_named_in_one_line(tmp_path: Path,
                                                                    no_slurm_env: dict[str, str]) -> None:
    """``--emulator cuda:99``: every system refuses the device when it loads the program (the error
    frames' path); the chief says which in one line, the job ends with its code, no task is left."""
    argv = cluster_argv(run_py(params(tmp_path, 64), tmp_path / "md", "--max_steps", "5"), streamers=1)
    argv[1:1] = ["--emulator", "cuda:99"]
    env = {**no_slurm_env, "OMP_NUM_THREADS": "1", "CLUSTER_TEST_MARK": str(tmp_path)}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, cwd=REPO)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert re.search(r"run\.py: error: system [12]: device: 'cuda:99' ", done.stderr), done.stderr[-2000:]
    assert "task rank 0 (chief) on" in done.stderr and "Traceback" not in done.stderr
    assert none_left(str(tmp_path))
