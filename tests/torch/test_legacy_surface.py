"""The R1.x surface: cb_model, module(model, device), Session.add_step_closure / mark_step,
cbtorch.save / load as weights-only data, cbtorch.state(), and --legacy-imports running the seed's
loop unedited."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import csrun.torch as cbtorch
import csrun.torch.core.cb_model as cm
from csrun.errors import UserError
from csrun.torch import process_state as state_mod
from csrun.torch import stack_state
from tests.conftest import BIN

SCRIPT = Path(__file__).parent / "scripts" / "legacy_loop.py"


@pytest.fixture(autouse=True)
def lone_chief(monkeypatch: pytest.MonkeyPatch):  # noqa: ANN201
    for name in ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID", "CS_IP",
                 "CSRUN_LAUNCHER"):
        monkeypatch.delenv(name, raising=False)
    state_mod.reset_for_tests()
    stack_state.reset_for_tests()
    yield
    state_mod.reset_for_tests()
    stack_state.reset_for_tests()


def loader() -> cbtorch.StreamingDataLoader:
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(32, 4, generator=g), torch.randint(0, 3, (32,), generator=g))
    return cbtorch.dataloader(DataLoader(data, batch_size=8, drop_last=True))


def test_cb_model_ordinals() -> None:
    assert (cm.get_ordinal(), cm.get_local_ordinal(), cm.xrt_world_size()) == (0, 0, 1)
    assert cm.is_master_ordinal() and cm.is_master_ordinal(local=True)
    assert cbtorch.is_master_ordinal(local=False) and cbtorch.world_size() == 1


def test_add_step_closure_with_kwargs_and_mark_step_run_it_at_once() -> None:
    seen: list[tuple] = []
    dl = loader()
    with cbtorch.Session(dl, report=False) as session:
        for i, (x, _) in enumerate(dl):
            cm.add_step_closure(lambda a, b=None: seen.append(("cm", a, b)), args=(i,), kwargs={"b": "k"})
            cm.mark_step()
            assert seen[-1] == ("cm", i, "k")  # mark_step ended the step: its closure ran
            session.add_step_closure(lambda a: seen.append(("session", a)), args=(i,))
            session.mark_step()
            assert seen[-1] == ("session", i)
    assert len(seen) == 8
    with pytest.raises(UserError, match="kwargs must be a dict"):
        cm.add_step_closure(print, kwargs=[1])  # type: ignore[arg-type]


def test_on_the_cpu_outside_a_session_a_closure_runs_at_once() -> None:
    """The R1.x zoo's CPU runner loops over its own DataLoader with no Session: its closures (the
    eval loss, the summaries) ran at once off the device."""
    cbtorch.initialize(cpu=True)
    model = cbtorch.module(torch.nn.Linear(4, 1))
    seen: list[float] = []
    for x in torch.randn(3, 2, 4):
        loss = model(x).sum()
        cm.add_step_closure(lambda v: seen.append(float(v)), args=(loss,))
        assert seen[-1] == float(loss)  # already ran
        cm.step_closure(lambda v: seen.append(-float(v)))(loss)
        assert seen[-1] == -float(loss)
    assert len(seen) == 6 and not state_mod.state().closures


def test_module_takes_a_legacy_device_argument() -> None:
    model = torch.nn.Linear(2, 2)
    assert cbtorch.module(model, None) is model and cbtorch.module(model, device="cpu") is model
    with pytest.raises(UserError, match="device='cuda'.*stays on the CPU"):
        cbtorch.module(model, device="cuda")


def test_save_and_load_are_weights_only(tmp_path: Path) -> None:
    state = {"model": {"w": torch.arange(4.0)}, "global_step": 3}
    path = tmp_path / "checkpoint_3.mdl"
    cbtorch.save(state, path)
    got = cbtorch.load(path)
    assert torch.equal(got["model"]["w"], state["model"]["w"]) and got["global_step"] == 3
    for bad in (torch.nn.Linear(2, 2), object(), lambda: 0):
        with pytest.raises(cbtorch.CheckpointFileError, match="not plain data") as exc:
            cbtorch.save({"model": bad}, tmp_path / "module.mdl")
        assert_no_unsafe_advice(str(exc.value))
    assert not (tmp_path / "module.mdl").exists()


def assert_no_unsafe_advice(message: str) -> None:
    """No message tells the user how to load a file as code (torch's own error does)."""
    for advice in ("weights_only=False", "can still be loaded", "trust the source", "safe_globals"):
        assert advice not in message, message


def test_load_refuses_a_pickle_payload_without_running_it(tmp_path: Path) -> None:
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self) -> tuple:
            return (Path.touch, (marker,))

    path = tmp_path / "evil.mdl"
    torch.save({"model": Evil()}, path)
    with pytest.raises(cbtorch.CheckpointFileError, match=r"not a weights-only checkpoint.*nothing in it was run") as exc:
        cbtorch.load(path)
    assert not marker.exists()
    assert_no_unsafe_advice(str(exc.value))


def losses(out: str) -> list[float]:
    line = next(x for x in out.splitlines() if x.startswith("LOSSES"))
    return [float(v) for v in line.split()[1:]]


@pytest.mark.timeout(180)
def test_legacy_imports_run_the_seed_loop_unedited(no_slurm_env: dict[str, str]) -> None:
    plain = subprocess.run([sys.executable, str(SCRIPT)], env=no_slurm_env, capture_output=True, text=True, timeout=60)
    assert plain.returncode != 0 and "No module named 'cerebras'" in plain.stderr  # nothing is installed
    cpu = subprocess.run([str(BIN / "csrun_cpu"), "--legacy-imports", sys.executable, str(SCRIPT)], env=no_slurm_env,
                         capture_output=True, text=True, timeout=60)
    assert cpu.returncode == 0, cpu.stderr
    device = {}
    for nodes in ("1", "3"):
        wse = subprocess.run([str(BIN / "csrun_wse"), "--legacy-imports", "--total-nodes", nodes, sys.executable,
                              str(SCRIPT)], env=no_slurm_env, capture_output=True, text=True, timeout=120)
        assert wse.returncode == 0, wse.stderr
        device[nodes] = losses(wse.stdout)
    eager = losses(cpu.stdout)
    assert len(eager) == 16 and len(device["1"]) == 16 and len(device["3"]) == 16
    # one task: the same batches; the device runs the default mixed precision (float16 rounding)
    assert max(abs(a - b) for a, b in zip(eager, device["1"])) < 1e-3
    assert all(0.5 < x < 2.0 for x in device["3"])  # two streamers: the same data in the streamers' order


def _cpu_run(make_scaler, steps: int = 6, overflow_at: int = 3) -> tuple[torch.nn.Module, list[float]]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = make_scaler()
    scales = []
    g = torch.Generator().manual_seed(1)
    for i in range(steps):
        opt.zero_grad()
        loss = model(torch.randn(8, 4, generator=g)).pow(2).mean()
        if i == overflow_at:
            loss = loss * float("inf")  # an injected overflow
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(float(scaler.get_scale()))
    return model, scales


def test_amp_grad_scaler_on_the_cpu_is_torchs_dynamic_scaling() -> None:
    ours, our_scales = _cpu_run(lambda: cbtorch.amp.GradScaler(loss_scale="dynamic", steps_per_increase=2))
    ref, ref_scales = _cpu_run(lambda: torch.amp.GradScaler("cpu", init_scale=2.0 ** 15, growth_interval=2))
    assert our_scales == ref_scales and our_scales[3] == our_scales[2] / 2  # the overflow halved it
    for a, b in zip(ours.parameters(), ref.parameters()):
        assert torch.equal(a, b)
    scaler = cbtorch.amp.GradScaler(steps_per_increase=2)
    _cpu_run(lambda: scaler)
    again = cbtorch.amp.GradScaler()
    again.load_state_dict(scaler.state_dict())
    assert again.get_scale() == scaler.get_scale() and again.state_dict() == scaler.state_dict()


def test_amp_static_scale_skips_an_overflowing_step() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = cbtorch.amp.GradScaler(loss_scale=128.0)
    before = [p.clone() for p in model.parameters()]
    scaler.scale(model(torch.randn(2, 4)).sum() * float("inf")).backward()
    scaler.step(opt)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters())) and scaler.get_scale() == 128.0
    with pytest.raises(UserError, match="loss_scale=-1"):
        cbtorch.amp.GradScaler(loss_scale=-1)


def test_amp_grad_scaler_on_the_device_leaves_the_scaling_to_it(tmp_path: Path) -> None:
    from csrun.compiler.spec import LossScalingSpec
    from tests.device.helpers import settings

    dynamic = LossScalingSpec(factor="dynamic")
    cbtorch.initialize("embedded", settings=settings(mixed_precision=True, loss_scaling=dynamic),
                       model_dir=str(tmp_path))
    model = cbtorch.module(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3)))
    opt = cbtorch.optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    scaler = cbtorch.amp.GradScaler()
    dl = loader()
    with cbtorch.Session(dl, report=False):
        for x, y in dl:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            assert scaler.scale(loss) is loss  # the device scales
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
    assert cbtorch.global_step() == 4
    state = scaler.state_dict()
    assert state["scale"] == scaler.get_scale() > 0  # the device's scaler


def test_state_records_compiler_knobs_with_one_notice_each(capsys: pytest.CaptureFixture[str]) -> None:
    """A model zoo's set_custom_stack_params, as written for R1.x."""
    state = cbtorch.state()
    assert state is cbtorch.state()
    state.full_config.matching.kernel.enable_pipelined_mlm_loss = True
    state.full_config.matching.kernel.inc_pwt_estimate = True
    state.full_config.matching.kernel.enable_pipelined_mlm_loss = True  # again: no second notice
    state.full_config.placement.optimize_buses.deltat_relative_margin = 0.5
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "csrun: cbtorch.state().full_config.matching.kernel.enable_pipelined_mlm_loss = True: csrun's compiler "
        "has no such knob; recorded, not used",
        "csrun: cbtorch.state().full_config.matching.kernel.inc_pwt_estimate = True: csrun's compiler has no "
        "such knob; recorded, not used",
        "csrun: cbtorch.state().full_config.placement.optimize_buses.deltat_relative_margin = 0.5: csrun's "
        "compiler has no such knob; recorded, not used",
    ]
    assert state.full_config.as_dict() == {
        "matching": {"kernel": {"enable_pipelined_mlm_loss": True, "inc_pwt_estimate": True}},
        "placement": {"optimize_buses": {"deltat_relative_margin": 0.5}},
    }
    assert state.full_config.matching.kernel.inc_pwt_estimate is True
    assert state.full_config.matching.never_set.as_dict() == {}


def test_state_execution_loop_metrics_and_trackers() -> None:
    state = cbtorch.state()
    assert state.is_inside_execution_loop is False
    with cbtorch.Session(loader(), report=False):
        assert state.is_inside_execution_loop is True
    assert state.is_inside_execution_loop is False
    metric = object()
    state.register_metric(metric)
    assert state.metrics == [metric]
    assert state.track_object({"loss": torch.zeros(())}) is None
    with state.init_tracker.entry("configure_optimizer"):
        pass
    assert state.rate_tracker is None
    with pytest.raises(AttributeError, match="full_config"):
        state.no_such_thing  # noqa: B018


def test_state_under_legacy_imports(no_slurm_env: dict[str, str]) -> None:
    code = ("import cerebras.framework.torch as cbtorch\n"
            "cbtorch.state().full_config.matching.kernel.no_dcache_spill_splits = True\n"
            "print(cbtorch.state().full_config.as_dict())")
    done = subprocess.run([str(BIN / "csrun_cpu"), "--legacy-imports", sys.executable, "-c", code], env=no_slurm_env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "{'matching': {'kernel': {'no_dcache_spill_splits': True}}}" in done.stdout
    assert "no_dcache_spill_splits = True: csrun's compiler has no such knob" in done.stderr


@pytest.mark.parametrize("loss_scale", ["dynamic", 128.0])
def test_a_skipped_update_still_counts_as_a_step_on_the_cpu(loss_scale: Any) -> None:
    """As on the device: the overflowing step's update is skipped, the global step (and with it the
    LR schedule) still advances."""
    from csrun.program.schedules import build_schedule
    from tests.device.helpers import WARMUP, settings

    cbtorch.initialize(None, cpu=True, settings=settings())
    torch.manual_seed(0)
    model = cbtorch.module(torch.nn.Linear(4, 2))
    opt = cbtorch.optimizer(torch.optim.SGD(model.parameters(), lr=0.05))
    scaler = cbtorch.amp.GradScaler(loss_scale=loss_scale)
    schedule, lrs = build_schedule(WARMUP), []
    for i in range(5):
        opt.zero_grad()
        loss = model(torch.randn(2, 4)).sum() * (float("inf") if i == 2 else 1.0)
        scaler.scale(loss).backward()
        before = [p.clone() for p in model.parameters()]
        scaler.step(opt)
        scaler.update()
        unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
        if i > 0:  # (step 0's warm-up learning rate is 0: nothing moves)
            assert unchanged == (i == 2), i
        lrs.append(opt.param_groups[0]["lr"])
    assert cbtorch.global_step() == 5
    assert lrs[3:] == [float(schedule(3)), float(schedule(4))]
