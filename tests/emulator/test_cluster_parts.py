"""The chief's side of a cluster of systems, piece by piece (issue 35): the global step's outputs
from the systems', each system's inputs from its own batch, what the cluster refuses, the
compile report's cluster plan, the 2.x API's view of the cluster."""

from __future__ import annotations

import pytest
import torch

from csrun.driver.cluster_steps import ClusterSteps
from csrun.driver.step_values import StepState
from csrun.emulator.swarm.device import ClusterError, Shards, SwarmEngine, reduce_outputs
from csrun.stream.source import EPOCH_END


def test_the_loss_is_the_systems_mean_counts_add_and_per_sample_outputs_join() -> None:
    got = reduce_outputs([
        {"loss": torch.tensor(1.0), "count": torch.tensor(3), "logits": torch.ones(2, 5)},
        {"loss": torch.tensor(2.0), "count": torch.tensor(4), "logits": torch.zeros(2, 5)},
    ], batch_size=2)
    assert got["loss"].item() == 1.5 and got["count"].item() == 7
    assert got["logits"].shape == (4, 5) and got["logits"][:2].eq(1).all() and got["logits"][2:].eq(0).all()
    with pytest.raises(ClusterError, match=r"output 'per_class' of shape \(3,\) is neither a scalar nor one row per sample"):
        reduce_outputs([{"per_class": torch.ones(3)}, {"per_class": torch.ones(3)}], batch_size=2)


def test_each_system_takes_its_inputs_from_its_own_batch() -> None:
    steps = ClusterSteps(3, notice=lambda _: None)
    first = {"x": torch.zeros(2, 4), "y": torch.zeros(2, dtype=torch.int64)}
    values = StepState(number=1, inputs=(first["y"], first["x"]), input_leaves=(1, 0))  # the step took y, then x
    others = [{"x": torch.full((2, 4), float(k)), "y": torch.full((2,), k)} for k in (2, 3)]
    shards = steps.shards(values, others)
    assert isinstance(shards, Shards) and len(shards.shards) == 3
    assert [s[0][0].item() for s in shards.shards] == [0, 2, 3] and [s[1][0, 0].item() for s in shards.shards] == [0, 2, 3]


def test_a_host_computed_input_or_a_different_shape_is_refused() -> None:
    steps = ClusterSteps(2, notice=lambda _: None)
    host = StepState(number=1, inputs=(torch.zeros(2, 4),), input_leaves=(-1,))
    with pytest.raises(ClusterError, match="computed on the host from the batch: compute it in the model's forward"):
        steps.shards(host, [{"x": torch.zeros(2, 4)}])
    fine = StepState(number=1, inputs=(torch.zeros(2, 4),), input_leaves=(0,))
    with pytest.raises(ClusterError, match=r"system 2's batch has input 0 \(1, 4\) float32, system 1's \(2, 4\)"):
        steps.shards(fine, [{"x": torch.zeros(1, 4)}])


def test_an_epoch_that_does_not_fill_a_step_leaves_its_last_batches_out_once() -> None:
    told: list[str] = []
    steps = ClusterSteps(3, notice=told.append)
    items = iter([1, EPOCH_END, 1, EPOCH_END])
    assert steps.gather(lambda: next(items)) is None and steps.gather(lambda: next(items)) is None
    assert len(told) == 1 and "do not fill a step of 3 systems" in told[0]
    more = iter([5, 6])
    assert steps.gather(lambda: next(more)) == [5, 6]


def test_eval_and_a_step_that_updates_buffers_run_on_one_system() -> None:
    from tests.emulator.helpers import make_program

    class Spec:
        mode = "eval"

    with pytest.raises(ClusterError, match="eval runs on one system"):
        SwarmEngine(None, Spec(), comm=None, num_csx=2)  # type: ignore[arg-type]  # refused before it sends anything
    class Normed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1))

        def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
            x, y = batch
            return ((self.net(x) - y) ** 2).mean()

    program, spec = make_program(Normed().train(), (torch.randn(8, 4), torch.randn(8, 1)))
    with pytest.raises(ClusterError, match=r"updates buffers \(.*running_mean.*each of 2 systems would keep"):
        SwarmEngine(program, spec, comm=None, num_csx=2)


def test_the_compile_report_plans_the_cluster() -> None:
    from csrun.compiler.report import cluster_lines

    class Plan:
        memoryx = __import__("csrun.compiler.wafer", fromlist=["MEMORYX"]).MEMORYX
        weight_stream_bytes_per_step, gradient_stream_bytes_per_step = 150e6, 75e6
        batch_size, est_samples_per_sec = 64, 1000.0

    assert cluster_lines(Plan(), 1) == []  # type: ignore[arg-type]
    (line,) = cluster_lines(Plan(), 4)  # type: ignore[arg-type]
    assert "4 systems x 64 samples = 256 samples a step" in line and "1,000.0 µs at its bandwidths" in line
    assert "up to 4,000.00 samples/s" in line


def test_the_2x_api_sees_the_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    from csrun.pytorch.distributed.service_resolver import service_resolver
    from csrun.pytorch.utils.config import CSConfig, CSConfigError
    from csrun.torch import process_state

    monkeypatch.setenv("CSRUN_NUM_CSX", "2")
    monkeypatch.setenv("PMI_SIZE", "7")  # chief, 2 systems, MemoryX, 3 streamers... of which rank 6 is this one
    monkeypatch.setenv("PMI_RANK", "6")
    process_state.reset_for_tests()
    try:
        with pytest.raises(CSConfigError, match="3 streamer task.* the same number of input workers per system"):
            CSConfig(num_csx=2).check(num_streamers=3, num_systems=2)
        with pytest.raises(CSConfigError, match=r"CSConfig\(num_csx=1\) but this job has 2 system.*--num-csx 1"):
            CSConfig(num_csx=1).check(num_systems=2)
        CSConfig(num_csx=2, num_workers_per_csx=2).check(num_streamers=4, num_systems=2)
        monkeypatch.setenv("PMI_SIZE", "8")
        process_state.reset_for_tests()
        spec = service_resolver().cluster_spec
        assert (spec.num_csx, spec.num_workers_per_csx, spec.rank) == (2, 2, 2)
        assert [(t.local_rank, t.wse_id) for t in spec.tasks] == [(0, 0), (0, 1), (1, 0), (1, 1)]
        assert all(t.local_rank * 2 + t.wse_id == t.rank for t in spec.tasks)  # the zoo's shard index is the rank
    finally:
        process_state.reset_for_tests()
