"""End-to-end stream tests: the same user script alone and under mpiexec with 1-3 streamers."""

from __future__ import annotations

import re

import pytest

from tests.stream.stream_helpers import expected_sequence, run_job

pytestmark = pytest.mark.usefixtures("mpiexec")


def _closure_log_ok(log: list, steps: int) -> None:
    """Every step: body, then its closures in order, before the next body."""
    body = [e for e in log if e[0] != "loop-end"]
    assert body[: 3 * steps] == [x for s in range(steps) for x in (["body", s], ["first", s], ["second", s])]


@pytest.mark.timeout(60)
def test_single_task_cpu_run(tmp_path):
    job = run_job(tmp_path / "o", 1, "--n", "8", "--epochs", "2", "--nested")
    assert job.rc == 0, job.output
    chief = job.records[0]
    assert chief["batches"] == expected_sequence(8, 2, 1, 8)
    assert chief["dtypes"] == {"idx": "torch.int64", "vec": "torch.float32", "ints": "torch.int64",
                               "half": "torch.bfloat16"}
    assert {k: chief[k] for k in ("is_master_ordinal", "is_streamer", "task_id", "num_tasks",
                                  "num_streamers", "streaming_rank", "rank_sum", "len")} == {
        "is_master_ordinal": True, "is_streamer": False, "task_id": 0, "num_tasks": 1,
        "num_streamers": 0, "streaming_rank": 0, "rank_sum": 0, "len": 4}
    _closure_log_ok(chief["log"], 8)
    # the last closures of each loop run when the loop ends, before the code after it
    assert chief["log"][11:13] == [["second", 3], ["loop-end", 4]]
    assert chief["mpi_loaded"] is False  # a single task never loads MPI
    assert chief["stats"]["streamers"] == [] and chief["stats"]["chief"]["batches"] == 8


@pytest.mark.timeout(60)
def test_one_streamer_exact_order_two_epochs(tmp_path):
    job = run_job(tmp_path / "o", 2, "--n", "10", "--batch", "3", "--epochs", "2")
    assert job.rc == 0, job.output
    assert job.records[0]["batches"] == expected_sequence(10, 3, 1, 6)
    assert job.records[0]["len"] == 3


@pytest.mark.timeout(60)
def test_two_streamers_nested_dtypes_helpers_closures(tmp_path):
    job = run_job(tmp_path / "o", 3, "--n", "12", "--epochs", "2", "--nested")
    assert job.rc == 0, job.output
    chief, s1, s2 = job.records[0], job.records[1], job.records[2]
    assert chief["batches"] == expected_sequence(12, 2, 2, 12)
    # int64 travelled as int32 and came back as int64; bfloat16 bit for bit
    assert chief["dtypes"] == {"idx": "torch.int64", "vec": "torch.float32", "ints": "torch.int64",
                               "half": "torch.bfloat16"}
    _closure_log_ok(chief["log"], 12)
    assert (chief["is_master_ordinal"], chief["is_streamer"], chief["streaming_rank"]) == (True, False, -1)
    assert (chief["task_id"], chief["num_tasks"], chief["num_streamers"]) == (0, 2, 2)
    for rank, rec in ((1, s1), (2, s2)):
        assert (rec["is_master_ordinal"], rec["is_streamer"]) == (False, True)
        assert (rec["task_id"], rec["streaming_rank"], rec["num_tasks"], rec["num_streamers"]) == (
            rank - 1, rank - 1, 2, 2)
        assert "batches" not in rec  # the body never ran on a streamer
    assert all(r["rank_sum"] == 3 for r in job.records.values())  # mesh_reduce over 0+1+2
    assert chief["len"] == 6
    streamers = chief["stats"]["streamers"]
    assert [s["rank"] for s in streamers] == [1, 2]
    assert all(s["batches"] >= 6 and s["bytes"] > 0 for s in streamers)
    assert "input stream" in job.output and "streamer 2" in job.output


@pytest.mark.timeout(60)
def test_three_streamers_order_and_stop_mid_epoch(tmp_path):
    job = run_job(tmp_path / "o", 4, "--n", "24", "--steps", "17", "--prefetch", "2")
    assert job.rc == 0, job.output
    assert job.records[0]["batches"] == expected_sequence(24, 2, 3, 17)


@pytest.mark.timeout(60)
def test_skip_resumes_the_exact_sequence(tmp_path):
    job = run_job(tmp_path / "o", 3, "--n", "12", "--epochs", "2", "--skip", "5")
    assert job.rc == 0, job.output
    # the first loop finishes epoch 0 (6 batches, 5 skipped), the second is epoch 1
    assert job.records[0]["batches"] == expected_sequence(12, 2, 2, 7, skip=5)


@pytest.mark.timeout(60)
def test_streamer_exception_ends_the_job_naming_rank_and_error(tmp_path):
    job = run_job(tmp_path / "o", 3, "--n", "24", "--fail-at", "5")
    assert job.rc != 0
    assert job.seconds < 30
    # sample 5 belongs to streamer 1 of 2 = rank 2. The failing streamer names itself and the
    # error at once; the chief's own line ("csrun: error: streamer rank 2 ... failed in its input
    # pipeline: ValueError: bad sample 5") comes before its MPI_Abort, and hydra may tear the job
    # down before forwarding it (seen about one run in five on two loaded cores)
    assert "csrun: streamer rank 2 (node " in job.output and "ValueError: bad sample 5" in job.output
    chief_line = "csrun: error: streamer rank 2 (node "
    if chief_line in job.output:
        assert "failed in its input pipeline: ValueError: bad sample 5" in job.output


@pytest.mark.timeout(60)
def test_streamer_killed_ends_the_job(tmp_path):
    job = run_job(tmp_path / "o", 3, "--n", "24", "--kill-at", "5", env={"CSRUN_STREAM_TIMEOUT": "5"})
    assert job.rc != 0
    assert job.seconds < 30
    # mpiexec (hydra) ends the job when a rank dies by a signal and says so; the chief's start
    # line names every streamer's pid, so the dead one can be told apart
    assert "signal 9" in job.output.lower() or "killed" in job.output.lower(), job.output
    assert "BAD TERMINATION" in job.output
    assert "batches" not in job.records.get(0, {})  # the chief never finished


@pytest.mark.timeout(60)
def test_silent_streamer_times_out_naming_it(tmp_path):
    job = run_job(tmp_path / "o", 3, "--n", "24", "--stall-at", "5", env={"CSRUN_STREAM_TIMEOUT": "2"})
    assert job.rc != 0
    assert job.seconds < 30
    assert re.search(r"csrun: error: waited 2 s for batch \d+ from streamer rank 2 \(node ", job.output), \
        job.output


@pytest.mark.timeout(90)
def test_chief_memory_stays_bounded_when_it_is_slow(tmp_path):
    # 4 MB batches, 100 of them (400 MB of data), 2 streamers, 2 in flight each, a slow chief
    width, batch, steps, prefetch, streamers = 262144, 4, 100, 2, 2
    job = run_job(tmp_path / "o", 1 + streamers, "--n", str(batch * streamers * 60), "--batch", str(batch),
                  "--width", str(width), "--steps", str(steps), "--prefetch", str(prefetch),
                  "--slow", "0.01", "--rss")
    assert job.rc == 0, job.output
    chief = job.records[0]
    batch_mb = batch * width * 4 / 2**20
    growth_mb = (max(chief["rss_kb"]) - chief["base_rss_kb"]) / 1024
    total_mb = steps * batch_mb
    bound_mb = (prefetch * streamers + 6) * batch_mb + 48
    assert len(chief["batches"]) == steps
    assert growth_mb < bound_mb < total_mb, (growth_mb, bound_mb, total_mb)
    # the streamers were held back by credit, not by memory
    assert sum(s["credit_wait_s"] for s in chief["stats"]["streamers"]) > 0.2


@pytest.mark.timeout(60)
def test_chief_exception_stops_streamers_and_fails_the_job(tmp_path):
    job = run_job(tmp_path / "o", 3, "--n", "24", "--chief-fail-at", "3")
    assert job.rc != 0
    assert job.seconds < 30
    assert "RuntimeError: chief fails at step 3" in job.output
    assert "Abort" not in job.output  # the streamers were stopped cleanly, not killed


@pytest.mark.timeout(60)
def test_chief_without_a_session_releases_the_streamers(tmp_path):
    job = run_job(tmp_path / "o", 3, "--n", "24", "--no-session")
    assert job.rc == 0, job.output
    assert job.seconds < 30
    assert "chief leaves without a session" in job.output


@pytest.mark.timeout(60)
def test_a_refilling_collate_is_refused_by_the_lone_chief_as_by_a_streamer(tmp_path):
    """A CPU run refuses what a streamed run would: the same message, at the second batch."""
    job = run_job(tmp_path / "o", 1, "--n", "12", "--batch", "3", "--refill")
    assert job.rc != 0
    assert "wrote into the tensor at [1] of a batch it had already handed over" in job.output, job.output


@pytest.mark.timeout(60)
def test_a_refilling_collate_on_a_streamer_ends_the_job_naming_the_leaf(tmp_path):
    """A streamer sends from the loader's tensors while the next batch loads: one that refills them
    in place is refused at its next batch, deterministically, not streamed as mixed batches."""
    job = run_job(tmp_path / "o", 2, "--n", "12", "--batch", "3", "--refill")
    assert job.rc != 0
    assert job.seconds < 30
    assert "wrote into the tensor at [1] of a batch it had already handed over" in job.output, job.output
    assert "return new tensors for every batch" in job.output
