"""R1.6's API as the Model Zoo uses it, under --legacy-imports: every import resolves to csrun (a
zoo-shaped ``try/except ImportError`` never falls back), the names keep their R1.6 meanings, and
a name csrun gives no meaning imports and refuses in one line when used."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import csrun.torch as cbtorch
import csrun.torch.core.cb_model as cm
from csrun.launch.environment import LEGACY_SHIM
from csrun.mdl import read_mdl
from csrun.torch import process_state as state_mod
from csrun.torch.r1 import amp as r1_amp
from csrun.torch.r1 import framework, modes, settings
from csrun.torch.r1.unsupported import LegacyNameError
from csrun.torch.r1.xla import SampleGenerator
from csrun.errors import UserError

GATE = Path(__file__).parent / "scripts" / "zoo_shaped_gate.py"


@pytest.fixture(autouse=True)
def lone_chief(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    for name in ("PMI_RANK", "PMI_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "CS_IP", "CSRUN_LAUNCHER"):
        monkeypatch.delenv(name, raising=False)
    state_mod.reset_for_tests()
    settings.reset_for_tests()
    r1_amp.reset_for_tests()
    framework.reset_for_tests()
    yield
    state_mod.reset_for_tests()
    settings.reset_for_tests()
    r1_amp.reset_for_tests()
    framework.reset_for_tests()


def test_a_zoo_shaped_gate_takes_csrun_and_never_its_fallback() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(LEGACY_SHIM), str(Path(__file__).parents[2])])}
    done = subprocess.run([sys.executable, str(GATE)], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["fell_back"] is False
    assert got["cbtorch"] == "csrun.torch.session" and got["amp"] == "csrun.torch.r1.amp"
    assert got["cm"] == "csrun.torch.core.cb_model" and got["modes"] == ["train", "eval", "train_and_eval"]
    assert got["perf"] is None and got["assess"] == "csrun.torch.r1.unsupported" and got["xla"] == 3
    assert got["num_tasks"] == 1 and got["loader"] == "StreamingDataLoader" and got["optimizer"] == "Optimizer"
    # R1.6's own extract_loss: the 2.x API (whose import makes a streamer wait for a role) stays out
    assert got["extract_loss"] == "csrun.torch.r1.framework" and got["two_x_imported"] is False


def test_without_the_shim_the_same_gate_falls_back() -> None:
    """The check above can fail: without --legacy-imports the gate takes its stub."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    done = subprocess.run([sys.executable, str(GATE)], capture_output=True, text=True, env=env, timeout=120)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"fell_back": True}


@pytest.mark.parametrize("use", [
    lambda: framework.nn.StripPadding(),
    lambda: framework.optim.lr_scheduler.Lambda(None, 0.1, False),
    lambda: framework.optim.lr_scheduler.Step(None, 0.1, 0.5, 10, True),
    lambda: framework.utils.nest.visit_xla_tensors({}),
    lambda: framework.appliance.ApplianceMode({}, None),
    lambda: cm.print_metrics_report(),
    lambda: cm.set_metric_state_names({}, "acc"),
    lambda: cm.RateTracker(),
    lambda: cm.set_target_num_replicas(2),
    lambda: framework.initialize(appliance=True),
])
def test_a_name_without_meaning_refuses_in_one_line_naming_csrun(use: Any) -> None:
    with pytest.raises(LegacyNameError) as exc:
        use()
    text = str(exc.value)
    assert text.startswith("csrun does not implement ") and "\n" not in text


def test_cb_model_keeps_the_r16_meanings(tmp_path: Path) -> None:
    framework.initialize(service_workdir=str(tmp_path))
    assert cm.num_tasks() == 1 and cm.num_receivers() == 1 and cm.get_streaming_rank() == 0
    assert not cm.use_cs() and not cm.is_wse_device() and not cm.is_sync_mode() and cm.device().type == "cpu"
    assert cm.rendezvous("barrier") == [] and cm.rendezvous("gather", payload="x") == ["x"]
    assert framework.env().service_workdir == str(tmp_path) and not framework.env().weight_streaming_mode
    cm.set_run_config(10, 5, 1)
    assert (cm.run_config.total_steps, cm.run_config.checkpoint_steps) == (10, 5)
    assert cm.metrics_counter_value("CerebrasCompileTimeMs") is None  # nothing compiled on the CPU
    model = cbtorch.module(torch.nn.Linear(2, 1))
    opt = framework.optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    assert isinstance(opt, framework.Optimizer) and opt._optimizer.param_groups[0]["params"] == opt.param_groups[0]["params"]
    assert not isinstance(torch.optim.SGD(model.parameters(), lr=0.1), framework.Optimizer)
    assert opt.convert_state_dict_for_checkpoint({"a": 1}) == {"a": 1}
    for _ in range(3):
        model(torch.ones(4, 2)).sum().backward()
        opt.step()
    assert cm.get_run_step() == 3
    scalars: list[tuple] = []

    class Writer:
        def add_scalar(self, *args: Any) -> None:
            scalars.append(args)

    cm.write_to_summary(Writer(), 3, dict_to_write={"loss": torch.tensor(0.5)})
    cm.write_to_summary(None, 3, dict_to_write={"loss": 1.0})  # non-chief ordinals have no writer
    assert scalars == [("loss", 0.5, 3)]
    path = tmp_path / "checkpoint_3.mdl"
    cm.save({"model": model.state_dict()}, str(path), master_only=True,
            post_transfer_callback=lambda sd: {**sd, "global_step": 3})
    assert read_mdl(path)["global_step"] == 3
    assert cm.to_cpu([torch.ones(1), {"a": torch.zeros(1)}])[1]["a"].device.type == "cpu"
    assert modes.is_valid("eval") and not modes.is_valid("predict")
    assert len(list(SampleGenerator(data=(torch.zeros(2),), sample_count=4))) == 4


def test_the_grad_scalers_arguments_are_checked_and_kept() -> None:
    with pytest.raises(r1_amp.GradScalerError, match="max_gradient_norm=-1"):
        r1_amp.GradScaler(max_gradient_norm=-1)
    r1_amp.GradScaler(loss_scale="dynamic", initial_loss_scale=None, max_gradient_norm=1.0, mixed_precision=True)
    assert r1_amp.get_init_params() == {"loss_scale": "dynamic", "max_gradient_norm": 1.0, "mixed_precision": True}
    conveyed = settings.current()
    assert conveyed.loss_scaling.factor == "dynamic" and conveyed.max_gradient_norm == 1.0


def test_on_the_cpu_the_scalers_clipping_is_the_eager_steps() -> None:
    """R1.6's GradScaler(max_gradient_norm=) clips on the CPU as the device does (its eager backend)."""
    framework.initialize()
    torch.manual_seed(0)
    model = cbtorch.module(torch.nn.Linear(3, 1))
    twin = torch.nn.Linear(3, 1)
    twin.load_state_dict(model.state_dict())
    opt = framework.optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    ref = torch.optim.SGD(twin.parameters(), lr=0.1)
    scaler = r1_amp.GradScaler(loss_scale=1.0, max_gradient_norm=0.01)
    x = torch.randn(8, 3)
    scaler(model(x).pow(2).sum()).backward()
    opt.step()
    twin(x).pow(2).sum().backward()
    torch.nn.utils.clip_grad_norm_(twin.parameters(), 0.01)
    ref.step()
    assert torch.equal(model.weight, twin.weight)


def test_a_presharded_loader_is_the_shard_and_a_mismatched_one_is_refused() -> None:
    from csrun.torch.sharding import DataLoaderError, LoaderSource, plan_shard, shard_loader
    from csrun.stream.source import EPOCH_END
    data = TensorDataset(torch.arange(24))
    seen: list[int] = []
    for rank in range(2):
        sampler = torch.utils.data.distributed.DistributedSampler(data, num_replicas=2, rank=rank, shuffle=True)
        loader = DataLoader(data, batch_size=4, sampler=sampler, drop_last=True)
        plan = plan_shard(loader, rank, 2)
        assert plan.presharded and plan.batches_per_epoch == 3
        local, shard_sampler = shard_loader(loader, plan)
        stream = LoaderSource(local, shard_sampler, plan).stream(0)
        for batch in stream:
            if batch is EPOCH_END:
                break
            seen += batch[0].tolist()
    assert sorted(seen) == list(range(24))  # every sample once: not sharded again
    wrong = torch.utils.data.distributed.DistributedSampler(data, num_replicas=3, rank=0)
    with pytest.raises(DataLoaderError, match="shard 0 of 3, but this task streams shard 1 of 2"):
        plan_shard(DataLoader(data, batch_size=4, sampler=wrong, drop_last=True), 1, 2)
    padded = torch.utils.data.distributed.DistributedSampler(TensorDataset(torch.arange(25)), num_replicas=2,
                                                              rank=0)
    with pytest.raises(DataLoaderError, match="pads its shard with repeated samples"):
        plan_shard(DataLoader(TensorDataset(torch.arange(25)), batch_size=4, sampler=padded, drop_last=True), 0, 2)


def test_r16_device_schedulers_are_the_segments_of_the_compiles_schedule() -> None:
    sched = framework.optim.lr_scheduler
    sched.Constant(None, 0.01, 5, False)
    assert settings.current().learning_rate == {"scheduler": "Constant", "learning_rate": 0.01, "steps": 5}
    sched.Exponential(None, 0.1, 2, 0.5, True, False)
    assert settings.current().learning_rate == [
        {"scheduler": "Constant", "learning_rate": 0.01, "steps": 5},
        {"scheduler": "Exponential", "initial_learning_rate": 0.1, "decay_steps": 2, "decay_rate": 0.5,
         "staircase": True}]
    with pytest.raises(UserError, match="decay_rate"):
        sched.Exponential(None, 0.1, 2, "fast", True, False)


class BatchesItself(torch.utils.data.IterableDataset):
    """Yields whole batches (the R1.x zoo's BERT input does, under ``DataLoader(batch_size=None)``)."""

    def __iter__(self):  # noqa: ANN204
        for i in range(3):
            yield {"ids": torch.full((4, 2), i, dtype=torch.int32), "label": torch.full((4,), i)}


def test_an_iterable_dataset_that_yields_batches_streams_them_as_they_are() -> None:
    framework.initialize()
    loader = cbtorch.dataloader(DataLoader(BatchesItself(), batch_size=None))
    assert loader.batch_size is None
    with cbtorch.Session(loader, report=False):
        got = [batch["ids"][0, 0].item() for batch in loader]
    assert got == [0, 1, 2]
    with pytest.raises(UserError, match="batch_size=None"):  # a map-style dataset still needs a batch size
        cbtorch.dataloader(DataLoader(TensorDataset(torch.arange(8)), batch_size=None))
