"""Golden files for the srun lines of every step shape (set CSRUN_UPDATE_GOLDEN=1 to rewrite)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from csrun.launch.hetjob import hetjob_script
from csrun.launch.layout import wse_layout
from csrun.launch.srun import cpu_srun_argv, job_name, mpiexec_argv, wse_srun_argv
from csrun.site import SiteConfig

GOLDEN = Path(__file__).parent / "golden"
SITE = SiteConfig(gres_node="cs-chief", gres_resource="cs:1", def_cpus_per_task=2)
SITE_PARTITION = SiteConfig(gres_node="cs-chief", gres_resource="cs:1", partition="wse", account="proj1")
SITE_SYSTEMS = SiteConfig(gres_node="cs-chief", gres_resource="cs:1", system_nodes="cs-sys[1-2]")
CMD = ["python-pt", "run.py", "--mode", "train", "--params", "configs/fc_mnist.yaml"]
CPU_NAME = job_name("csrun_cpu", CMD)
WSE_NAME = job_name("csrun_wse", CMD)

CASES = {
    "cpu_exclude_gres": lambda: cpu_srun_argv(CMD, SITE, exclude_gres=True, pty=False, name=CPU_NAME),
    "cpu_pty_no_exclude": lambda: cpu_srun_argv(CMD, SITE, exclude_gres=False, pty=True, name=CPU_NAME),
    "cpu_partition_account": lambda: cpu_srun_argv(CMD, SITE_PARTITION, exclude_gres=True, pty=False, name=CPU_NAME),
    "wse_1_node": lambda: wse_srun_argv(CMD, wse_layout(nodes=1, tasks_per_node=4, cpus_per_task=2, single_task_nodes=0, cyclic=False), SITE, name=WSE_NAME),
    "wse_3_nodes": lambda: wse_srun_argv(CMD, wse_layout(nodes=3, tasks_per_node=2, cpus_per_task=1, single_task_nodes=0, cyclic=False), SITE, name=WSE_NAME),
    "wse_3_nodes_cyclic_partition": lambda: wse_srun_argv(CMD, wse_layout(nodes=3, tasks_per_node=2, cpus_per_task=1, single_task_nodes=0, cyclic=True), SITE_PARTITION, name=WSE_NAME),
    "wse_5_nodes_2_single_4_per_node": lambda: wse_srun_argv(CMD, wse_layout(nodes=5, tasks_per_node=4, cpus_per_task=1, single_task_nodes=2, cyclic=False), SITE, name=WSE_NAME),
    "wse_4_nodes_2_single_2_per_node_cyclic": lambda: wse_srun_argv(CMD, wse_layout(nodes=4, tasks_per_node=2, cpus_per_task=1, single_task_nodes=2, cyclic=True), SITE, name=WSE_NAME),
    "hetjob_4_nodes_2_single_2_per_node_cyclic": lambda: hetjob_script(CMD, wse_layout(nodes=4, tasks_per_node=2, cpus_per_task=1, single_task_nodes=2, cyclic=True), SITE_PARTITION, job_name=WSE_NAME, log_dir=Path("/logs"), time="01:00:00", cwd="/work"),
    "hetjob_3_nodes_preemptible": lambda: hetjob_script(CMD, wse_layout(nodes=3, tasks_per_node=1, cpus_per_task=1, single_task_nodes=0, cyclic=False), SITE, job_name=WSE_NAME, log_dir=Path("/logs"), time="60", cwd="/work", preempt_lead=90),
    "hetjob_1_node": lambda: hetjob_script(CMD, wse_layout(nodes=1, tasks_per_node=2, cpus_per_task=1, single_task_nodes=0, cyclic=False), SITE, job_name="j", log_dir=Path("/logs"), time="", cwd="/work"),
    "wse_cluster_2_systems_5_nodes": lambda: wse_srun_argv(CMD, wse_layout(nodes=5, tasks_per_node=2, cpus_per_task=1, single_task_nodes=0, cyclic=False, num_csx=2), SITE, name=WSE_NAME),
    "wse_cluster_2_systems_7_nodes_2_single_cyclic_system_nodes": lambda: wse_srun_argv(CMD, wse_layout(nodes=7, tasks_per_node=4, cpus_per_task=1, single_task_nodes=2, cyclic=True, num_csx=2), SITE_SYSTEMS, name=WSE_NAME),
    "hetjob_cluster_2_systems_5_nodes_preemptible_system_nodes": lambda: hetjob_script(CMD, wse_layout(nodes=5, tasks_per_node=2, cpus_per_task=1, single_task_nodes=0, cyclic=False, num_csx=2), SITE_SYSTEMS, job_name=WSE_NAME, log_dir=Path("/logs"), time="60", cwd="/work", preempt_lead=90),
    "mpiexec_cluster_2_systems_5_nodes": lambda: mpiexec_argv("mpiexec", CMD, wse_layout(nodes=5, tasks_per_node=2, cpus_per_task=1, single_task_nodes=0, cyclic=False, num_csx=2)),
    "mpiexec_5_nodes_2_single_4_per_node": lambda: mpiexec_argv("mpiexec", CMD, wse_layout(nodes=5, tasks_per_node=4, cpus_per_task=1, single_task_nodes=2, cyclic=False)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str) -> None:
    made = CASES[name]()
    line = made if isinstance(made, str) else " ".join(made) + "\n"
    line = line.replace(sys.executable, "PYTHON")  # the task wrapper's interpreter: this checkout's venv
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("CSRUN_UPDATE_GOLDEN") == "1":
        path.write_text(line)
    assert line == path.read_text()


def test_legacy_example_has_14_tasks_and_gres_only_on_component_0() -> None:
    layout = wse_layout(nodes=5, tasks_per_node=4, cpus_per_task=1, single_task_nodes=2, cyclic=False)
    assert layout.total_tasks == 14
    line = wse_srun_argv(["cmd"], layout, SITE)
    components = " ".join(line).split(" : ")
    assert len(components) == 3
    assert "--gres=cs:1" in components[0] and all("--gres" not in c for c in components[1:])
    assert line.count("--mpi=pmi2") == 1 and line[:5] == ["srun", "--unbuffered", "--kill-on-bad-exit", "--quit-on-interrupt", "--mpi=pmi2"]
