"""The CSRUN_* environment contract the launchers give every task."""

from __future__ import annotations

from csrun.launch.environment import task_environment
from csrun.site import SiteConfig, load_site_config


def test_contract_variables_and_mount_dirs_merge() -> None:
    site = SiteConfig(mount_dirs=("/data",), gres_node="cs-chief")
    env = task_environment(launcher="csrun_wse", mode="local", site=site, extra_mounts=("/scratch", "/data"), total_tasks=6, total_nodes=3, base={"CS_IP": "h:9000", "PATH": "/bin"})
    assert (env["CSRUN_LAUNCHER"], env["CSRUN_LAUNCH_MODE"], env["CSRUN_TOTAL_TASKS"], env["CSRUN_TOTAL_NODES"]) == ("csrun_wse", "local", "6", "3")
    assert env["CSRUN_MOUNT_DIRS"] == "/data,/scratch" and env["CS_IP"] == "h:9000" and env["PATH"] == "/bin"
    assert load_site_config({**env, "CSRUN_SITE_CONFIG": ""}).mount_dirs == ("/data", "/scratch")
    assert "MPIR_CVAR_CH4_NETMOD" not in env and "FI_PROVIDER" not in env


def slurm_launch_env(base: dict[str, str]) -> dict[str, str]:
    return task_environment(launcher="csrun_wse", mode="slurm", site=SiteConfig(), extra_mounts=(), total_tasks=2, total_nodes=1, base=base)


def test_slurm_launches_use_ofi_tcp_unless_the_user_chose_a_netmod() -> None:
    env = slurm_launch_env({})
    assert (env["MPIR_CVAR_CH4_NETMOD"], env["FI_PROVIDER"]) == ("ofi", "tcp")
    env = slurm_launch_env({"FI_PROVIDER": "verbs"})
    assert (env["MPIR_CVAR_CH4_NETMOD"], env["FI_PROVIDER"]) == ("ofi", "verbs")
    env = slurm_launch_env({"MPIR_CVAR_CH4_NETMOD": "ucx", "UCX_TLS": "rc,self"})
    assert (env["MPIR_CVAR_CH4_NETMOD"], env["UCX_TLS"]) == ("ucx", "rc,self") and "FI_PROVIDER" not in env
    env = slurm_launch_env({"MPICH_CH4_NETMOD": "ucx"})
    assert "MPIR_CVAR_CH4_NETMOD" not in env and "FI_PROVIDER" not in env
