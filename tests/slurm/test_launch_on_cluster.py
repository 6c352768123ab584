"""The launchers on the real local Slurm cluster (slurm/local-cluster start --workers 4).

Each task runs tests/scripts/task_probe.py, which writes its rank, node, role, MPI view and
CSRUN_* environment to a file; the tests check the set against the legacy layout. The cluster is
shared: the chief lands on a node that holds the GRES (the cluster says which: tests/slurm/nodes.py),
the streamers off the site's GRES node; which of the allowed nodes is Slurm's choice.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

import pytest

from csrun.site import load_site_config
from tests.conftest import BIN, PROBE, read_probes
from tests.slurm.nodes import gres_nodes

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(1200)]  # generous: the cluster is shared and busy
GRES_NODE = load_site_config({}).gres_node
SLEEP = "3600"
"""What the other tasks of a job with a failing task sleep: a job that ends at all ended by the failure."""


def launch(argv: list[str], env: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)


def wse(options: list[str], out: Path, env: dict[str, str], *probe_args: str) -> subprocess.CompletedProcess[str]:
    return launch([str(BIN / "csrun_wse"), *options, str(BIN / "python-pt"), str(PROBE), str(out), *probe_args], env)


def test_csrun_cpu_runs_on_one_exclusive_node_off_the_gres_node(slurm_env: dict[str, str], tmp_path: Path) -> None:
    done = launch([str(BIN / "csrun_cpu"), str(BIN / "python-pt"), str(PROBE), str(tmp_path)], slurm_env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("Running: srun --job-name=csrun_cpu:task_probe.py --nodes=1 --ntasks=1 --exclusive --cpus-per-task=1 --exclude=cs-chief ")
    probes = read_probes(tmp_path)
    assert list(probes) == [0]
    rec = probes[0]
    assert rec["node"] != GRES_NODE
    assert (rec["role"], rec["launcher"], rec["launch_mode"]) == ("chief", "csrun_cpu", "slurm")


def test_csrun_cpu_alloc_node_false_runs_here(slurm_env: dict[str, str], tmp_path: Path) -> None:
    done = launch([str(BIN / "csrun_cpu"), "--alloc-node", "False", str(BIN / "python-pt"), str(PROBE), str(tmp_path)], slurm_env)
    assert done.returncode == 0, done.stderr
    assert read_probes(tmp_path)[0]["launch_mode"] == "local"


def check_world(probes: dict[int, dict], tasks: int, env: dict[str, str]) -> str:
    """The ranks form one world in the legacy layout; returns the chief's node (one with the GRES)."""
    assert sorted(probes) == list(range(tasks))
    for rank, rec in probes.items():
        assert rec["mpi_rank"] == rank and rec["mpi_size"] == tasks, rec
        assert rec["allreduce"] == tasks, "every component must be in one MPI world"
        assert rec["role"] == ("chief" if rank == 0 else "streamer")
        assert (rec["launcher"], rec["launch_mode"], rec["num_tasks"]) == ("csrun_wse", "slurm", tasks)
        assert rec["env"]["CSRUN_TOTAL_TASKS"] == str(tasks)
    assert probes[0]["node"] in gres_nodes(env), probes[0]["node"]
    return str(probes[0]["node"])


def test_one_node(slurm_env: dict[str, str], tmp_path: Path) -> None:
    done = wse(["--total-nodes", "1", "--tasks-per-node", "2"], tmp_path, slurm_env)
    assert done.returncode == 0, done.stderr
    assert "Launching: srun --unbuffered --kill-on-bad-exit --quit-on-interrupt --mpi=pmi2 --job-name=csrun_wse:task_probe.py --exclusive --nodes=1 --tasks-per-node=2" in done.stdout
    probes = read_probes(tmp_path)
    chief = check_world(probes, 2, slurm_env)
    assert {r["node"] for r in probes.values()} == {chief}


def test_three_nodes_chief_component_and_workers(slurm_env: dict[str, str], tmp_path: Path) -> None:
    done = wse(["--total-nodes", "3", "--tasks-per-node", "2"], tmp_path, {**slurm_env, "CS_IP": "127.0.0.1:9000"})
    assert done.returncode == 0, done.stderr
    probes = read_probes(tmp_path)
    chief = check_world(probes, 6, slurm_env)
    nodes = Counter(r["node"] for r in probes.values())
    assert nodes[chief] == 2 and len(nodes) == 3 and set(nodes.values()) == {2}
    assert probes[1]["node"] == chief
    assert all(probes[r]["node"] not in (chief, GRES_NODE) for r in range(2, 6))
    assert {r["env"]["CS_IP"] for r in probes.values()} == {"127.0.0.1:9000"}


def test_single_task_nodes_and_cyclic(slurm_env: dict[str, str], tmp_path: Path) -> None:
    done = wse(["--total-nodes", "4", "--single-task-nodes", "2", "--tasks-per-node", "2", "--cyclic"], tmp_path, slurm_env)
    assert done.returncode == 0, done.stderr
    assert "--distribution=cyclic" in done.stdout
    probes = read_probes(tmp_path)
    chief = check_world(probes, 6, slurm_env)
    nodes = Counter(r["node"] for r in probes.values())
    assert nodes[chief] == 1, "the chief is alone on its GRES node"
    assert nodes[probes[1]["node"]] == 1 and probes[1]["node"] not in (chief, GRES_NODE), "rank 1 is alone on its node"
    rest = {r: probes[r]["node"] for r in range(2, 6)}
    assert len(set(rest.values())) == 2 and not set(rest.values()) & {chief, GRES_NODE, probes[1]["node"]}
    assert rest[2] == rest[4] and rest[3] == rest[5] and rest[2] != rest[3], "cyclic: ranks alternate over the worker nodes"


def test_a_failing_task_ends_the_step(slurm_env: dict[str, str], tmp_path: Path) -> None:
    """The others would sleep an hour: the step ends (within the launch's deadline) because one failed."""
    done = wse(["--total-nodes", "2", "--tasks-per-node", "2"], tmp_path, slurm_env, "--fail-rank", "3", "--sleep", SLEEP)
    assert done.returncode != 0


SLURM_PMI1_READ = 1024
"""Slurm's mpi/pmi2 plugin reads one PMI-1 request with a single read() of this many bytes."""


def test_mpi_init_requests_fit_slurms_pmi_read_and_need_no_segments(slurm_env: dict[str, str], tmp_path: Path) -> None:
    """Every PMI request MPI_Init sends across four nodes fits in one Slurm read, and no business
    card is cut into segments: under UCX the card is 4 KB of address plus heap bytes, and a
    segment past 1024 bytes killed MPI_Init now and then (CI, stop 7)."""
    done = wse(["--total-nodes", "4", "--single-task-nodes", "1", "--tasks-per-node", "1"], tmp_path, {**slurm_env, "PMI_DEBUG": "1"})
    assert done.returncode == 0, done.stderr
    check_world(read_probes(tmp_path), 4, slurm_env)
    requests = [line.split("pmi: ", 1)[1] for line in done.stderr.splitlines() if "send to fd=" in line and "pmi: cmd=" in line]
    puts = [r for r in requests if r.startswith("cmd=put ")]
    assert puts, "PMI_DEBUG showed no put: the address exchange was not seen"
    longest = max(requests, key=len)
    assert len(longest) + 1 <= SLURM_PMI1_READ, longest[:200]
    assert not [p for p in puts if "value=segments=" in p], "a business card needed PMI segments"


def test_use_sbatch_wait_returns_the_exit_code_and_leaves_logs(slurm_env: dict[str, str], tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    cmd = [str(BIN / "csrun_cpu"), "--use-sbatch", "--wait", "--log-dir", str(logs), "--job-name", "csrun-test", "bash", "-c", "echo from-the-batch-job; exit 4"]
    done = launch(cmd, slurm_env)
    assert done.returncode == 4, done.stdout + done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("Submitted batch job ")
    job_id = first.split()[3].rstrip(";")
    folder = logs / job_id
    assert folder.is_dir()
    outs = list(folder.glob("*_log.out"))
    assert outs and "from-the-batch-job" in outs[0].read_text()


def test_use_sbatch_without_wait_returns_at_once(slurm_env: dict[str, str], tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    done = launch([str(BIN / "csrun_cpu"), "--use-sbatch", "--log-dir", str(logs), "true"], slurm_env)
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.split()[3].rstrip(";")
    assert job_id.isdigit()
    subprocess.run(["scancel", job_id], env=slurm_env, check=False)


def test_csrun_wse_use_sbatch_runs_the_layout_as_a_heterogeneous_job(slurm_env: dict[str, str], tmp_path: Path) -> None:
    logs, out = tmp_path / "logs", tmp_path / "out"
    argv = [str(BIN / "csrun_wse"), "--use-sbatch", "--wait", "--log-dir", str(logs), "--total-nodes", "3", "--tasks-per-node", "2", str(BIN / "python-pt"), str(PROBE), str(out)]
    done = launch(argv, slurm_env)
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = done.stdout.split()[3].rstrip(";")
    assert (logs / job_id / f"{job_id}_log.out").exists() and "#SBATCH hetjob" in (logs / job_id / "job.sbatch").read_text()
    probes = read_probes(out)
    chief = check_world(probes, 6, slurm_env)
    assert Counter(r["node"] for r in probes.values())[chief] == 2


def test_csrun_wse_use_sbatch_wait_reports_a_failure(slurm_env: dict[str, str], tmp_path: Path) -> None:
    """The chief would sleep an hour: the batch job ends (within the launch's deadline) because rank 1 failed."""
    argv = [str(BIN / "csrun_wse"), "--use-sbatch", "--wait", "--log-dir", str(tmp_path / "logs"), "--total-nodes", "2", "--tasks-per-node", "1", str(BIN / "python-pt"), str(PROBE), str(tmp_path / "out"), "--fail-rank", "1", "--sleep", SLEEP]
    done = launch(argv, slurm_env)
    assert done.returncode != 0
