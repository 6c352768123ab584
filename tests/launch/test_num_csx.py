"""``csrun_wse --num-csx N``: the cluster's layout, its srun / batch shapes, the option, the
environment, and the task wrapper's command on a system or MemoryX rank (no job runs here; the
real ones are in test_num_csx_slurm.py)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from csrun.cli import csrun_wse
from csrun.cluster import CHIEF, MEMORYX, STREAMER, SYSTEM, cluster_info
from csrun.errors import UsageError
from csrun.launch.environment import cluster_environment
from csrun.launch.hetjob import hetjob_script
from csrun.launch.layout import Layout, min_cluster_nodes, wse_layout
from csrun.launch.options import WseOptions, parse_args
from csrun.launch.srun import cpu_srun_argv, wse_srun_argv
from csrun.launch.task import SWARM_TASK, task_command_for
from csrun.site import SiteConfig

SITE = SiteConfig(gres_node="cs-chief", gres_resource="cs:1")
SITE_SYSTEMS = SiteConfig(gres_node="cs-chief", gres_resource="cs:1", system_nodes="cs-sys[1-4]")


def cluster(nodes: int, num_csx: int = 2, tasks: int = 2, single: int = 0, cyclic: bool = False) -> Layout:
    return wse_layout(nodes=nodes, tasks_per_node=tasks, cpus_per_task=1, single_task_nodes=single, cyclic=cyclic,
                      num_csx=num_csx)


def roles(layout: Layout) -> list[str]:
    """Each rank's role as csrun.cluster names it, for the layout's tasks in component order."""
    total = layout.total_tasks
    env = {"PMI_SIZE": str(total), "CSRUN_NUM_CSX": str(layout.num_csx)}
    return [cluster_info({**env, "PMI_RANK": str(rank)}).role for rank in range(total)]


def components(line: list[str]) -> list[str]:
    return " ".join(line).split(" : ")


def test_two_systems_on_five_nodes_chief_systems_memoryx_streamers_in_rank_order() -> None:
    layout = cluster(5)
    assert [(c.nodes, c.tasks_per_node) for c in layout.components] == [(1, 1), (2, 1), (1, 1), (1, 2)]
    assert [c.gres for c in layout.components] == [True, True, False, False]
    assert [c.systems for c in layout.components] == [False, True, False, False]
    assert [c.worker for c in layout.components] == [False, False, True, True]
    assert (layout.total_tasks, layout.total_nodes, layout.num_csx) == (6, 5, 2)
    assert roles(layout) == [CHIEF, SYSTEM, SYSTEM, MEMORYX, STREAMER, STREAMER]


@pytest.mark.parametrize("num_csx, nodes, tasks", [(2, 8, 3), (3, 6, 1), (4, 9, 2)])
def test_ranks_follow_the_contract_for_any_size(num_csx: int, nodes: int, tasks: int) -> None:
    layout = cluster(nodes, num_csx=num_csx, tasks=tasks)
    streamers = (nodes - num_csx - 2) * tasks
    assert layout.total_tasks == num_csx + 2 + streamers and layout.total_nodes == nodes
    assert roles(layout) == [CHIEF, *[SYSTEM] * num_csx, MEMORYX, *[STREAMER] * streamers]


def test_single_task_nodes_and_cyclic_apply_to_the_streamers() -> None:
    layout = cluster(7, single=3, tasks=4, cyclic=True)
    # the chief is the first one-task node: S=3 gives two one-task streamer nodes after MemoryX
    assert [(c.nodes, c.tasks_per_node) for c in layout.components] == [(1, 1), (2, 1), (1, 1), (1, 1), (1, 1), (1, 4)]
    assert roles(layout) == [CHIEF, SYSTEM, SYSTEM, MEMORYX, STREAMER, STREAMER, *[STREAMER] * 4]
    line = components(wse_srun_argv(["cmd"], layout, SITE))
    assert [("--distribution=cyclic" in c) for c in line] == [False] * 5 + [True]


def test_too_many_single_task_nodes_is_one_usage_line() -> None:
    with pytest.raises(UsageError) as err:
        cluster(6, single=3)  # 2 streamer nodes: S-1 = 2 one-task ones would leave none for the rest
    assert "'--single-task-nodes' (3)" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("num_csx", [2, 3, 5])
def test_too_few_nodes_names_the_minimum_and_the_fix(num_csx: int) -> None:
    least = min_cluster_nodes(num_csx)
    assert least == num_csx + 3
    cluster(least, num_csx=num_csx)  # the minimum itself is fine
    with pytest.raises(UsageError) as err:
        cluster(least - 1, num_csx=num_csx)
    text = str(err.value)
    assert "\n" not in text
    assert f"needs at least {least} nodes" in text and f"--total-nodes {least}" in text
    assert f"'--total-nodes' is {least - 1}" in text


def test_one_system_is_todays_layout() -> None:
    for kw in (dict(nodes=1, single_task_nodes=0), dict(nodes=3, single_task_nodes=0), dict(nodes=5, single_task_nodes=2)):
        today = wse_layout(tasks_per_node=4, cpus_per_task=1, cyclic=False, **kw)  # type: ignore[arg-type]
        assert wse_layout(tasks_per_node=4, cpus_per_task=1, cyclic=False, num_csx=1, **kw) == today  # type: ignore[arg-type]
        assert today.num_csx == 1 and not any(c.systems for c in today.components)


def test_srun_gres_on_the_chief_and_each_system_exclusive_systems_and_workers() -> None:
    line = components(wse_srun_argv(["cmd"], cluster(5), SITE))
    assert len(line) == 4
    assert ["--gres=cs:1" in c for c in line] == [True, True, False, False]
    assert ["--exclusive" in c for c in line] == [False, True, True, True]
    assert "--exclude" not in line[0]
    assert all(c.split().count("--exclude=cs-chief") == 1 for c in line[1:])


def test_site_system_nodes_keep_the_chief_memoryx_and_streamers_off_them() -> None:
    line = components(wse_srun_argv(["cmd"], cluster(5), SITE_SYSTEMS))
    assert "--exclude=cs-sys[1-4]" in line[0].split()
    assert "--exclude=cs-chief" in line[1].split()
    assert all("--exclude=cs-chief,cs-sys[1-4]" in c.split() for c in line[2:])
    # csrun_cpu keeps off them too; a site that names none gets today's line
    assert "--exclude=cs-chief,cs-sys[1-4]" in cpu_srun_argv(["cmd"], SITE_SYSTEMS, exclude_gres=True, pty=False)
    assert "--exclude=cs-chief" in cpu_srun_argv(["cmd"], SITE, exclude_gres=True, pty=False)


def test_batch_job_has_the_same_components() -> None:
    script = hetjob_script(["cmd"], cluster(6, tasks=3), SITE_SYSTEMS, job_name="j", log_dir=Path("/logs"), time="",
                           cwd="/w")
    blocks = script.split("#SBATCH hetjob")
    assert len(blocks) == 4
    assert ["#SBATCH --gres=cs:1" in b for b in blocks] == [True, True, False, False]
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1" in blocks[1]
    assert "#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=3" in blocks[3]
    assert "#SBATCH --exclude=cs-chief\n" in blocks[1] and "#SBATCH --exclude=cs-chief,cs-sys[1-4]\n" in blocks[2]
    assert "--het-group=3" in script and "--het-group=4" not in script
    assert "the 2 systems (ranks 1-2), MemoryX (rank 3)" in script


@pytest.mark.parametrize("spelling", [["--num-csx", "3"], ["--num_csx", "3"], ["--num-csx=3"], ["--num_csx=3"]])
def test_option_spellings(spelling: list[str]) -> None:
    parsed = parse_args([*spelling, "python", "x.py"], WseOptions, "csrun_wse")
    assert parsed.options.num_csx == 3 and parsed.command == ["python", "x.py"]
    assert parse_args(["cmd"], WseOptions, "csrun_wse").options.num_csx == 1


@pytest.mark.parametrize("value, says", [("0", "'0' must be at least 1"), ("-2", "must be at least 1"),
                                         ("two", "'two' is not a whole number"), ("1.5", "is not a whole number")])
def test_bad_value_is_one_usage_line_exit_2(value: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert csrun_wse.main(["--num-csx", value, "--dry-run", "true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "option --num-csx" in err and says in err and "Traceback" not in err


def test_help_says_what_it_does(capsys: pytest.CaptureFixture[str]) -> None:
    assert csrun_wse.main(["--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--num-csx" in out and "MemoryX" in out and "data parallel" in out


@pytest.fixture()
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """srun/scontrol/sinfo that only answer the launcher's probe (8 CPUs a node)."""
    folder = tmp_path / "fake-slurm"
    folder.mkdir()
    for name, text in {"srun": "exit 99", "scontrol": "echo 'Slurmctld(primary) at fake is UP'", "sinfo": "echo 8"}.items():
        (folder / name).write_text(f"#!/bin/sh\n{text}\n")
        (folder / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    return folder


def test_dry_run_prints_the_cluster_step(fake_slurm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert csrun_wse.main(["--num-csx", "2", "--total-nodes", "6", "--tasks-per-node", "2", "--dry-run", "python", "x.py"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Launching: srun --unbuffered --kill-on-bad-exit --quit-on-interrupt --mpi=pmi2 --job-name=csrun_wse:x.py ")
    line = out.removeprefix("Launching: ").split(" : ")
    assert [re.search(r"--nodes=(\d+) ", c).group(1) for c in line] == ["1", "2", "1", "2"]  # type: ignore[union-attr]
    assert ["--gres=cs:1" in c for c in line] == [True, True, False, False]
    wrapper = f"{sys.executable} -m csrun.launch.task -- python x.py"
    assert all(c.rstrip().endswith(wrapper) for c in line)  # every component runs the wrapper; it picks the command


def test_dry_run_default_nodes_grow_to_the_minimum(fake_slurm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert csrun_wse.main(["--num-csx", "3", "--dry-run", "true"]) == 0  # the site's def_nodes is 1
    line = capsys.readouterr().out.split(" : ")
    assert len(line) == 4 and "--nodes=3 --tasks-per-node=1" in line[1] and "--nodes=1" in line[3]
    assert csrun_wse.main(["--num-csx", "3", "--total-nodes", "5", "--dry-run", "true"]) == 2
    assert "needs at least 6 nodes" in capsys.readouterr().err


def test_dry_run_emulator_starts_no_cs_emulator_for_a_cluster(fake_slurm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert csrun_wse.main(["--num-csx", "2", "--emulator", "cuda:1", "--dry-run", "true"]) == 0
    assert "job_emulator" not in capsys.readouterr().out
    assert csrun_wse.main(["--emulator", "--dry-run", "true"]) == 0  # one system: as before
    assert "-m csrun.launch.job_emulator --device cpu -- true" in capsys.readouterr().out


def test_dry_run_batch_script(fake_slurm: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert csrun_wse.main(["--num-csx", "2", "--total-nodes", "5", "--use-sbatch", "--dry-run", "true"]) == 0
    script = capsys.readouterr().out
    assert script.count("#SBATCH hetjob") == 3 and script.count("#SBATCH --gres=cs:1") == 2


def test_dry_run_without_slurm_runs_every_task_under_mpiexec(no_slurm_env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PATH", no_slurm_env["PATH"])
    assert csrun_wse.main(["--num-csx", "2", "--total-nodes", "6", "--tasks-per-node", "3", "--dry-run", "true"]) == 0
    out = capsys.readouterr().out
    assert "running the 10 tasks locally under mpiexec" in out and " -n 10 " in out  # 1 + 2 + 1 + 2*3


@pytest.mark.parametrize("num_csx, device, expect", [
    (1, "", {}), (1, "cuda", {}),
    (2, "", {"CSRUN_NUM_CSX": "2"}),
    (3, "cuda:1", {"CSRUN_NUM_CSX": "3", "CSRUN_SYSTEM_DEVICE": "cuda:1"}),
])
def test_cluster_environment(num_csx: int, device: str, expect: dict[str, str]) -> None:
    env = {"CSRUN_NUM_CSX": "7", "CSRUN_SYSTEM_DEVICE": "cuda:3", "CS_IP": "h:9000", "OTHER": "x"}
    cluster_environment(env, num_csx=num_csx, system_device=device)
    left = {k: v for k, v in env.items() if k.startswith("CSRUN_")}
    assert left == expect  # stale values never reach a job
    assert env["OTHER"] == "x"
    assert ("CS_IP" in env) is not (num_csx > 1 and bool(device))  # --emulator: the systems are the device


@pytest.mark.parametrize("rank, swarm", [(0, False), (1, False), (2, False), (3, False), (4, False)])
def test_one_system_wrapper_runs_the_command_everywhere(rank: int, swarm: bool) -> None:
    info = cluster_info({"PMI_RANK": str(rank), "PMI_SIZE": "5"})
    assert task_command_for(info, ["python-pt", "run.py"]) == ["python-pt", "run.py"]


@pytest.mark.parametrize("rank, replaced", [(0, False), (1, True), (2, True), (3, True), (4, False), (5, False)])
def test_cluster_wrapper_runs_the_swarm_task_on_systems_and_memoryx(rank: int, replaced: bool) -> None:
    info = cluster_info({"PMI_RANK": str(rank), "PMI_SIZE": "6", "CSRUN_NUM_CSX": "2"})
    command = ["apptainer", "exec", "img.sif", "python", "run.py", "--mode", "train"]
    got = task_command_for(info, command)
    if replaced:
        assert got == [sys.executable, "-m", SWARM_TASK] and SWARM_TASK == "csrun.emulator.swarm.task"
    else:
        assert got == command
