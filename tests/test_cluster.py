"""csrun.cluster: the one map from Slurm/MPI variables to rank, role, node and job size."""

from __future__ import annotations

from csrun.cluster import CHIEF, STREAMER, cluster_info


def test_alone_is_the_chief_with_no_streamers() -> None:
    info = cluster_info({})
    assert (info.rank, info.num_tasks, info.role, info.num_streamers, info.streaming_rank) == (0, 1, CHIEF, 0, 0)


def test_mpich_variables() -> None:
    info = cluster_info({"PMI_RANK": "2", "PMI_SIZE": "4", "MPI_LOCALRANKID": "2", "CSRUN_LAUNCHER": "csrun_wse", "CSRUN_LAUNCH_MODE": "local"})
    assert (info.rank, info.num_tasks, info.local_rank, info.role, info.streaming_rank) == (2, 4, 2, STREAMER, 1)
    assert (info.launcher, info.launch_mode) == ("csrun_wse", "local")


def test_pmi_wins_over_slurm_per_component_values() -> None:
    env = {"PMI_RANK": "5", "PMI_SIZE": "6", "SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURMD_NODENAME": "cs-w2", "SLURM_JOB_ID": "17"}
    info = cluster_info(env)
    assert (info.rank, info.num_tasks, info.node_name, info.job_id) == (5, 6, "cs-w2", "17")


def test_slurm_heterogeneous_step_sums_components() -> None:
    env = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_HET_SIZE": "2", "SLURM_NTASKS_HET_GROUP_0": "1", "SLURM_NTASKS_HET_GROUP_1": "4"}
    info = cluster_info(env)
    assert (info.rank, info.num_tasks) == (3, 5)


def test_chief_with_streamers_has_no_streaming_rank() -> None:
    info = cluster_info({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "3"})
    assert (info.role, info.num_streamers, info.streaming_rank) == (CHIEF, 2, -1)


def test_launcher_job_and_device_address_are_carried() -> None:
    info = cluster_info({"CSRUN_LAUNCHER": "csrun_wse", "SLURM_JOB_ID": "42", "CS_IP": " node7:9100 "})
    assert (info.launcher, info.job_id, info.cs_ip) == ("csrun_wse", "42", "node7:9100")
    assert cluster_info({}).cs_ip == "" and cluster_info({}).job_id == ""


def test_slurm_counts_only_inside_a_step() -> None:
    """salloc -n 2 / an sbatch -n 4 body without srun: a plain python is one task (issue 11)."""
    from csrun.cluster import allocation_notice

    body = cluster_info({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4", "SLURM_PROCID": "0"})
    assert body.num_tasks == 1 and body.is_chief and body.allocation_tasks == 4
    assert "4 tasks" in (allocation_notice(body) or "")
    salloc = cluster_info({"SLURM_JOB_ID": "8", "SLURM_NTASKS": "2"})
    assert salloc.num_tasks == 1 and salloc.allocation_tasks == 2
    step = cluster_info({"SLURM_JOB_ID": "9", "SLURM_NTASKS": "3", "SLURM_PROCID": "2", "SLURM_STEP_ID": "0"})
    assert step.num_tasks == 3 and step.rank == 2 and step.allocation_tasks == 0
    assert allocation_notice(step) is None
    one = cluster_info({"SLURM_JOB_ID": "10", "SLURM_NTASKS": "1"})
    assert one.allocation_tasks == 0 and allocation_notice(one) is None


def test_a_cluster_job_has_systems_and_memoryx_before_the_streamers() -> None:
    from csrun.cluster import MEMORYX, SYSTEM

    roles = [cluster_info({"PMI_RANK": str(r), "PMI_SIZE": "6", "CSRUN_NUM_CSX": "2"}) for r in range(6)]
    assert [i.role for i in roles] == [CHIEF, SYSTEM, SYSTEM, MEMORYX, STREAMER, STREAMER]
    assert [i.input_rank for i in roles] == [0, -1, -1, -1, 1, 2]
    assert [i.streaming_rank for i in roles] == [-1, -1, -1, -1, 0, 1]
    assert {(i.input_tasks, i.num_streamers, i.swarm_tasks) for i in roles} == {(3, 2, 3)}
    assert [i.in_swarm for i in roles] == [False, True, True, True, False, False]
    lone = cluster_info({"PMI_RANK": "0", "PMI_SIZE": "4", "CSRUN_NUM_CSX": "2"})
    assert (lone.input_tasks, lone.num_streamers, lone.streaming_rank) == (1, 0, 0)  # the chief streams itself
    one = cluster_info({"PMI_RANK": "1", "PMI_SIZE": "3", "CSRUN_NUM_CSX": "1"})
    assert (one.role, one.swarm_tasks, one.streaming_rank) == (STREAMER, 0, 0)  # one system: no cluster roles


def test_a_bad_system_count_names_the_variable() -> None:
    import pytest

    from csrun.errors import ConfigError

    for bad in ("0", "two", "-1"):
        with pytest.raises(ConfigError) as exc:
            cluster_info({"CSRUN_NUM_CSX": bad})
        assert "CSRUN_NUM_CSX" in str(exc.value) and repr(bad) in str(exc.value)
