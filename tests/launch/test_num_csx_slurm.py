"""``csrun_wse --num-csx 2`` jobs that really run: on the local Slurm cluster (started with
``slurm/local-cluster start --workers 4 --systems 2``: nodes cs-chief, cs-w1..4, cs-sys1..2) and
locally under mpiexec.

The chief and the streamers run tests/launch/scripts/cluster_probe.py (a file per rank; the chief
sends the swarm tasks ``stop``); the task wrapper runs the real ``python -m
csrun.emulator.swarm.task`` on the systems and MemoryX, whose placement and command the per-task
log headers (``--log-dir``) show. Those tests need the swarm task to serve ``stop``;
:func:`test_the_cluster_step_shape_places_every_component` runs the step's srun line without the
wrapper and needs only Slurm. On the cluster the site's ``system_nodes`` are set
(tests/slurm/nodes.py ``pinned_env``): the placement asserted is the one asked for, on a shared
cluster whose other jobs hold nodes.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from csrun.launch.layout import wse_layout
from csrun.launch.srun import wse_srun_argv
from csrun.site import load_site_config
from tests.conftest import BIN, REPO
from tests.slurm.nodes import pinned_env

pytestmark = [pytest.mark.timeout(1200)]  # generous: the machine and the cluster are shared and busy
CLUSTER_PROBE = REPO / "tests" / "launch" / "scripts" / "cluster_probe.py"
SYSTEM_NODES = {"cs-sys1", "cs-sys2"}
HEADER = re.compile(r"^=== csrun task rank (\d+) on (\S+), attempt 0: (.*) \(\d{4}-")


def run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def probes(out: Path) -> dict[int, dict]:
    return {int(p.stem.split("_")[1]): json.loads(p.read_text()) for p in out.glob("rank_*.json")}


def headers(logs: Path) -> dict[int, tuple[str, str]]:
    """rank -> (node, the command its wrapper ran), from each task log's first line."""
    found: dict[int, tuple[str, str]] = {}
    for path in logs.glob("*.log"):
        match = HEADER.match(path.read_text().splitlines()[0])
        assert match, path.read_text()[:300]
        found[int(match.group(1))] = (match.group(2), match.group(3))
    return found


def launch(options: list[str], env: dict[str, str], tmp_path: Path) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    out, logs = tmp_path / "out", tmp_path / "logs"
    done = run([str(BIN / "csrun_wse"), "--num-csx", "2", *options, "--log-dir", str(logs), sys.executable,
                str(CLUSTER_PROBE), str(out)], env, tmp_path)
    return done, out, logs


def check_ranks(done: subprocess.CompletedProcess[str], out: Path, logs: Path, *, streamers: int, mode: str) -> None:
    """Ranks 0 and 4.. ran the probe as the chief and the streamers, 1..2 the systems' and 3 MemoryX's swarm task."""
    assert done.returncode == 0, done.stdout + done.stderr
    total = 4 + streamers
    seen = headers(logs)
    assert sorted(seen) == list(range(total))
    swarm = f"{sys.executable} -m csrun.emulator.swarm.task"
    assert [seen[r][1] == swarm for r in range(total)] == [False, True, True, True] + [False] * streamers
    records = probes(out)
    assert sorted(records) == [0, *range(4, total)]
    assert [records[r]["role"] for r in sorted(records)] == ["chief"] + ["streamer"] * streamers
    assert [records[r]["streaming_rank"] for r in sorted(records)] == [-1, *range(streamers)]
    for rec in records.values():
        assert (rec["mpi_size"], rec["num_csx"], rec["input_tasks"]) == (total, 2, 1 + streamers)
        assert rec["mpi_rank"] == rec["rank"]
        env = rec["env"]
        assert (env["CSRUN_NUM_CSX"], env["CSRUN_LAUNCH_MODE"], env["CSRUN_TOTAL_TASKS"]) == ("2", mode, str(total))
        assert "CSRUN_SYSTEM_DEVICE" not in env  # no --emulator: the systems run on cpu
        assert seen[rec["rank"]][0] == rec["node"]


@pytest.mark.slurm
def test_two_systems_on_slurm_chief_on_the_gres_node_systems_on_system_nodes(slurm_env: dict[str, str],
                                                                              tmp_path: Path) -> None:
    """Needs the real swarm task (it must serve the chief's ``stop``)."""
    done, out, logs = launch(["--total-nodes", "5", "--tasks-per-node", "2"], pinned_env(slurm_env), tmp_path)
    assert "Launching: srun " in done.stdout and done.stdout.count(" : ") == 3
    check_ranks(done, out, logs, streamers=2, mode="slurm")
    nodes = {rank: node for rank, (node, _) in headers(logs).items()}
    assert nodes[0] == load_site_config({}).gres_node == "cs-chief"
    assert {nodes[1], nodes[2]} == SYSTEM_NODES  # one system a node, each with its GRES
    assert nodes[3].startswith("cs-w") and nodes[4] == nodes[5] and nodes[4].startswith("cs-w")
    assert nodes[3] != nodes[4]  # MemoryX's node is its own (exclusive)


@pytest.mark.slurm
def test_the_cluster_step_shape_places_every_component(slurm_env: dict[str, str], tmp_path: Path) -> None:
    """The srun line of a 2-system cluster, run without the task wrapper (every rank prints who and
    where it is): only Slurm is needed."""
    layout = wse_layout(nodes=6, tasks_per_node=2, cpus_per_task=1, single_task_nodes=0, cyclic=False, num_csx=2)
    pinned = pinned_env(slurm_env)
    site = load_site_config({"CSRUN_SYSTEM_NODES": pinned["CSRUN_SYSTEM_NODES"]})
    line = wse_srun_argv([sys.executable, "-m", "csrun.cluster"], layout, site, name="num_csx_shape")
    env = {k: v for k, v in slurm_env.items() if k != "CSRUN_NUM_CSX"}  # plain ranks: chief and streamers by name
    done = run(line, env, tmp_path)
    assert done.returncode == 0, done.stderr
    placed = {int(m.group(1)): m.group(2) for m in re.finditer(r"rank (\d+)/8 \w+(?: \d+)? on (cs-[a-z]+\d*)", done.stdout)}  # lines may interleave
    assert sorted(placed) == list(range(8)), done.stdout
    assert placed[0] == "cs-chief" and {placed[1], placed[2]} == SYSTEM_NODES
    workers = [placed[r] for r in range(3, 8)]
    assert all(n.startswith("cs-w") for n in workers)
    assert placed[3] not in workers[1:] and placed[4] == placed[5] and placed[6] == placed[7] and placed[4] != placed[6]


def test_two_systems_locally_under_mpiexec(no_slurm_env: dict[str, str], tmp_path: Path) -> None:
    """Without Slurm: the same layout's tasks in the same order on this machine. Needs the real swarm task."""
    done, out, logs = launch(["--total-nodes", "5"], no_slurm_env, tmp_path)
    assert "running the 5 tasks locally under mpiexec" in done.stdout and " -n 5 " in done.stdout
    check_ranks(done, out, logs, streamers=1, mode="local")
