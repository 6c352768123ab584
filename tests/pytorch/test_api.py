"""csrun.pytorch in-process: what each name does, and the one-line refusals for what csrun cannot do."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import csrun.pytorch as cstorch
from csrun.compiler.optim import legacy_type_of
from csrun.program.schedules import build_schedule
from csrun.errors import UserError
from csrun.program.optimizers import OPTIMIZERS
from csrun.pytorch.utils.config import CSConfigError
from csrun.pytorch.utils.data import ExecutorError
from csrun.torch.saving import CheckpointFileError
from tests.pytorch.scripts import tiny

pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("fresh")]


def loader(samples: int = 80) -> cstorch.utils.data.DataLoader:
    x, y = tiny.dataset().tensors
    ds = torch.utils.data.TensorDataset(x[:samples], y[:samples])
    return cstorch.utils.data.DataLoader(torch.utils.data.DataLoader, ds, batch_size=8, drop_last=True)


def train(backend: Any, executor: cstorch.utils.data.DataExecutor, *, norm: Any = None,
          on_step: Any = None) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A small 2.x loop; ``norm(step)`` gives optimizer_step's max_gradient_norm."""
    torch.manual_seed(0)
    with backend.device:
        model = tiny.Model()
    compiled = cstorch.compile(model, backend)
    opt = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.trace
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.nll_loss(compiled(x), y)
        cstorch.amp.optimizer_step(loss, opt, max_gradient_norm=norm(executor.step) if norm else None)
        return loss

    for x, y in executor:
        step(x, y)
        if on_step is not None:
            on_step(executor)
    return model, opt


def _eager_clipped(norms: list[float]) -> torch.nn.Module:
    """:func:`train`'s loop in plain torch, clipping step i's gradients to ``norms[i]``."""
    torch.manual_seed(0)
    model = tiny.Model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = tiny.dataset().tensors
    for i, limit in enumerate(norms):
        loss = torch.nn.functional.nll_loss(model(x[8 * i:8 * i + 8]), y[8 * i:8 * i + 8])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), limit)
        opt.step()
        opt.zero_grad()
    return model


def one_line(exc: pytest.ExceptionInfo[BaseException], *words: str) -> None:
    text = str(exc.value)
    assert "\n" not in text and isinstance(exc.value, UserError), text
    for word in words:
        assert word in text, text


def test_backend_refusals() -> None:
    with pytest.raises(UserError) as exc:
        cstorch.backend("GPU")
    one_line(exc, "'GPU'", "'CSX'", "'CPU'")
    with pytest.raises(UserError) as exc:
        cstorch.backend("CPU", compile_only=True)
    one_line(exc, "compile_only", "cstorch.backend('CSX', compile_only=True)")
    first = cstorch.backend("CPU")
    assert cstorch.backend("cpu") is first and cstorch.current_backend() is first and first.is_cpu
    with pytest.raises(UserError) as exc:
        cstorch.backend("CSX")
    one_line(exc, "already exists")
    with pytest.raises(UserError) as exc:
        cstorch.compile("not a model", first)  # type: ignore[arg-type]
    one_line(exc, "torch.nn.Module", "str")


def test_optimizers_are_the_tables() -> None:
    cstorch.backend("CPU")
    assert set(cstorch.optim.OPTIMIZER_CLASSES) == set(OPTIMIZERS)
    params = [torch.nn.Parameter(torch.ones(2))]
    for name, cls in cstorch.optim.OPTIMIZER_CLASSES.items():
        assert getattr(cstorch.optim, cls.__name__) is cls and issubclass(cls, cstorch.optim.Optimizer)
        assert legacy_type_of(cls(params, lr=0.01)) == name  # the compiler reads each as its type
    opt = cstorch.optim.configure_optimizer("AdamW", [("w", params[0])], learning_rate=0.01, beta1=0.8,
                                            correct_bias=False)
    assert legacy_type_of(opt) == "adamw" and opt.param_groups[0]["betas"][0] == 0.8
    ramp = [{"scheduler": "Linear", "initial_learning_rate": 0.02, "end_learning_rate": 0.1, "total_iters": 4},
            {"scheduler": "Constant", "learning_rate": 0.1}]  # 2.2.1's flow passes the schedule itself
    scheduled = cstorch.optim.configure_optimizer("sgd", params, learning_rate=ramp)
    assert scheduled.param_groups[0]["lr"] == pytest.approx(0.02)  # the schedule's first rate until it is built
    with pytest.raises(UserError) as exc:
        cstorch.optim.configure_optimizer("sgd", params, learning_rate={"scheduler": "Constant"})
    one_line(exc, "needs ['learning_rate']")
    with pytest.raises(UserError) as exc:
        cstorch.optim.configure_optimizer("sgdd", params, learning_rate=0.1)
    one_line(exc, "'sgdd'")


def test_an_optimizer_needs_a_backend() -> None:
    with pytest.raises(UserError) as exc:
        cstorch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    one_line(exc, "cstorch.backend('CSX')")


@pytest.mark.parametrize("backend_type", ["CPU", "CSX"])
def test_lr_schedulers_follow_the_global_step(backend_type: str, tmp_path: Path) -> None:
    backend = cstorch.backend(backend_type, artifact_dir=str(tmp_path))
    torch.manual_seed(0)
    model = cstorch.compile(tiny.Model(), backend)
    opt = cstorch.optim.SGD(model.parameters(), lr=1.0)
    with pytest.raises(UserError) as exc:
        cstorch.optim.lr_scheduler.SequentialLR(opt, [cstorch.optim.lr_scheduler.LinearLR(opt, 0.1, 0.2, 5),
                                                      cstorch.optim.lr_scheduler.ConstantLR(opt, 0.1)], [4])
    one_line(exc, "runs 5 steps", "segment is 4")
    sched = cstorch.optim.lr_scheduler.SequentialLR(opt, [
        cstorch.optim.lr_scheduler.LinearLR(opt, 0.1, 0.2, total_iters=4),
        cstorch.optim.lr_scheduler.StepLR(opt, 0.3, step_size=2, gamma=0.5)], milestones=[4])
    expected = build_schedule([{"scheduler": "Linear", "initial_learning_rate": 0.1, "end_learning_rate": 0.2,
                                "steps": 4, "cycle": False},
                               {"scheduler": "Step", "learning_rate": 0.3, "step_size": 2, "gamma": 0.5}])
    seen: list[float] = []
    twin = tiny.Model()
    twin.load_state_dict({k: v.clone() for k, v in model.state_dict().items()})

    @cstorch.trace
    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = torch.nn.functional.nll_loss(model(x), y)
        cstorch.amp.optimizer_step(loss, opt)
        sched.step()
        return loss

    for x, y in cstorch.utils.data.DataExecutor(loader()):
        seen.append(sched.get_last_lr()[0])  # the rate of this step
        step(x, y)
    for k, (x, y) in enumerate(loader().streaming().shard_loader):  # plain SGD at the expected rates
        torch.nn.functional.nll_loss(twin(x), y).backward()
        with torch.no_grad():
            for p in twin.parameters():
                p -= expected(k) * p.grad
                p.grad = None
    assert seen == [expected(k) for k in range(10)]
    assert sched.state_dict() == {"global_step": 10}
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):  # the device ran the same rates
        assert torch.allclose(p, q, atol=1e-6, rtol=0), name
    if backend_type == "CSX":
        [spec] = tmp_path.glob("cs_*/spec.json")
        assert json.loads(spec.read_text())["learning_rate"][1]["scheduler"] == "Step"


def test_checkpoint_closure_runs_at_exactly_the_checkpoint_steps() -> None:
    backend = cstorch.backend("CPU")
    ran: list[int] = []

    @cstorch.checkpoint_closure
    def checkpoint(step: int) -> None:
        ran.append(step)

    executor = cstorch.utils.data.DataExecutor(loader(), num_steps=14, checkpoint_steps=4)
    train(backend, executor, on_step=lambda ex: checkpoint(ex.step))
    assert ran == [4, 8, 12, 14] and executor.step == 14  # 14 steps: more than the loader's 10, then the last
    checkpoint(0)  # outside the loop (2.2.1's save_initial_checkpoint): at once
    assert ran == [4, 8, 12, 14, 0]


def test_cs_config_refusals() -> None:
    cstorch.backend("CPU")
    cstorch.utils.data.DataExecutor(loader(), cs_config=cstorch.utils.CSConfig(num_csx=16))  # the CPU validates it
    with pytest.raises(CSConfigError) as exc:
        cstorch.utils.CSConfig(num_csx=16).check(num_systems=1)  # the device's loop: the job's systems
    one_line(exc, "num_csx=16", "this job has 1 system", "csrun_wse --num-csx 16")
    with pytest.raises(CSConfigError) as exc:
        cstorch.utils.CSConfig(mgmt_address="10.0.0.1:443").check()
    one_line(exc, "mgmt_address='10.0.0.1:443'", "--cs_ip")
    with pytest.raises(CSConfigError) as exc:
        cstorch.utils.CSConfig(python_paths=["/x"]).check()
    one_line(exc, "PYTHONPATH")
    executor = cstorch.utils.data.DataExecutor(loader(), cs_config=cstorch.utils.CSConfig(num_workers_per_csx=2))
    with pytest.raises(CSConfigError) as exc:
        next(iter(executor))
    one_line(exc, "num_workers_per_csx=2", "0 streamer", "--total-nodes 3")


def test_steps_outside_the_loop_and_twice_per_batch_are_refused() -> None:
    backend = cstorch.backend("CPU")
    model = cstorch.compile(tiny.Model(), backend)

    @cstorch.trace
    def step(x: torch.Tensor) -> torch.Tensor:
        return model(x).sum()

    with pytest.raises(ExecutorError) as exc:
        step(torch.ones(8, 8))
    one_line(exc, "step() runs inside `for batch in executor:`")
    with pytest.raises(ExecutorError) as exc:
        iter(loader()).__next__()
    one_line(exc, "DataExecutor")
    with pytest.raises(ExecutorError) as exc:
        for x, _ in cstorch.utils.data.DataExecutor(loader()):
            step(x)
            step(x)
    one_line(exc, "twice in step 1")
    bad = cstorch.utils.data.DataLoader(lambda: [1, 2])
    with pytest.raises(ExecutorError) as exc:
        len(bad)
    one_line(exc, "returned list", "torch.utils.data.DataLoader")


def test_a_setting_changed_after_the_compile_is_refused(tmp_path: Path) -> None:

    cstorch.amp.set_half_dtype(torch.bfloat16)
    backend = cstorch.backend("CSX", artifact_dir=str(tmp_path), mixed_precision=True)

    def switch(executor: Any) -> None:
        if executor.step == 3:
            cstorch.amp.set_half_dtype(torch.float16)

    with pytest.raises(UserError) as exc:
        train(backend, cstorch.utils.data.DataExecutor(loader()), on_step=switch)
    one_line(exc, "half_dtype changed after the step was compiled")


@pytest.mark.parametrize("kind", ["CPU", "CSX"])
def test_clipping_that_changes_between_steps_clips_each_step_as_asked(tmp_path: Path, kind: str) -> None:
    """optimizer_step's clipping is each step's own (torch's clip_grad_norm_), on the device too."""
    backend = cstorch.backend(kind, artifact_dir=str(tmp_path))
    model, _ = train(backend, cstorch.utils.data.DataExecutor(loader()), norm=lambda step: 0.05 if step < 3 else 0.5)
    reference = _eager_clipped([0.05, 0.05, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5])
    for name, want in reference.state_dict().items():
        assert torch.equal(model.state_dict()[name], want), name


def test_half_dtype_reaches_the_compile_and_bad_ones_are_refused(tmp_path: Path) -> None:
    with pytest.raises(UserError) as exc:
        cstorch.amp.set_half_dtype(torch.int8)
    one_line(exc, "torch.int8", "torch.float16")
    assert cstorch.amp.get_half_dtype() == torch.float16  # 2.2.1's default half type
    assert cstorch.amp.set_half_dtype("cbfloat16") == torch.float16  # its proxy dtype
    assert cstorch.amp.set_half_dtype(torch.bfloat16) == torch.bfloat16 == cstorch.amp.get_half_dtype()
    backend = cstorch.backend("CSX", artifact_dir=str(tmp_path), mixed_precision=True)  # the switch
    train(backend, cstorch.utils.data.DataExecutor(loader(16)))
    [spec] = tmp_path.glob("cs_*/spec.json")
    assert json.loads(spec.read_text())["precision"] == "cbfloat16"


def test_choosing_a_half_dtype_switches_nothing_on(tmp_path: Path) -> None:
    """2.2.1: set_half_dtype picks the type; without mixed_precision the device computes float32."""
    cstorch.amp.set_half_dtype(torch.float16)
    backend = cstorch.backend("CSX", artifact_dir=str(tmp_path))
    train(backend, cstorch.utils.data.DataExecutor(loader(16)))
    [spec] = tmp_path.glob("cs_*/spec.json")
    assert json.loads(spec.read_text())["precision"] == "float32"


def test_cpu_mixed_precision_is_bfloat16_autocast_as_in_2_2_1() -> None:
    with pytest.raises(UserError) as exc:
        cstorch.backend("CPU", mixed_precision=True)  # the half type is float16
    one_line(exc, "bfloat16 autocast", "set_half_dtype(torch.bfloat16)")
    cstorch.amp.set_half_dtype(torch.bfloat16)
    backend = cstorch.backend("CPU", mixed_precision=True)
    seen: list[torch.dtype] = []

    @cstorch.trace
    def step(x: torch.Tensor) -> torch.Tensor:
        y = torch.nn.functional.linear(x, torch.ones(3, x.shape[1]))
        seen.append(y.dtype)
        return y

    for x, _ in cstorch.utils.data.DataExecutor(loader(), num_steps=1):
        step(x)
    assert backend.autocast_dtype == torch.bfloat16 and seen == [torch.bfloat16]


@pytest.mark.parametrize("flag", ["compile_only", "validate_only"])
def test_compile_only_and_validate_only_stop_after_the_first_step(flag: str, tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    backend = cstorch.backend("CSX", artifact_dir=str(tmp_path), **{flag: True})
    with pytest.raises(SystemExit) as exc:
        train(backend, cstorch.utils.data.DataExecutor(loader()))
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert ("Compile for training completed successfully!" in out) == (flag == "compile_only")
    assert bool(list(tmp_path.glob("cs_*/spec.json"))) == (flag == "compile_only")


def test_break_ends_the_run_and_its_last_closures_run(tmp_path: Path) -> None:
    backend = cstorch.backend("CSX", artifact_dir=str(tmp_path))
    losses: list[float] = []

    @cstorch.step_closure
    def keep(loss: torch.Tensor) -> None:
        losses.append(loss.item())

    model = cstorch.compile(tiny.Model(), backend)
    opt = cstorch.optim.SGD(model.parameters(), lr=0.1)

    @cstorch.compile_step
    def step(batch: Any) -> torch.Tensor:
        loss = torch.nn.functional.nll_loss(model(batch[0]), batch[1])
        cstorch.amp.optimizer_step(loss, opt)
        return loss

    dataloader = loader()
    executor = cstorch.utils.data.DataExecutor(dataloader)
    for i, _ in enumerate(executor):
        keep(step(dataloader))  # the skeleton's form: the executor's DataLoader stands for the batch
        if i == 2:
            break
    assert len(losses) == 3 and cstorch.current_executor() is None
    assert torch.isfinite(model.fc1.weight).all()  # the device's weights after three steps


def test_save_and_load_share_the_runners_layout(tmp_path: Path) -> None:
    cstorch.save({"model": {"w": torch.ones(2)}, "grad_scaler": {"scale": 8.0}, "global_step": 3}, tmp_path / "a.mdl")
    assert torch.load(tmp_path / "a.mdl", weights_only=True)["amp"] == {"scale": 8.0}  # what the runner reads
    torch.save({"model": {}, "amp": {"scale": 4.0}}, tmp_path / "b.mdl")
    assert cstorch.load(tmp_path / "b.mdl")["grad_scaler"] == {"scale": 4.0}
    torch.save({"model": torch.nn.Linear(1, 1)}, tmp_path / "code.mdl")  # a pickled object: never unpickled
    with pytest.raises(CheckpointFileError) as exc:
        cstorch.load(tmp_path / "code.mdl")
    one_line(exc, "code.mdl", "not a weights-only checkpoint")


def test_csx_under_csrun_cpu_is_the_cpu_validation_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CSRUN_LAUNCHER", "csrun_cpu")
    backend = cstorch.backend("CSX")
    assert backend.is_csx and not backend.on_device and backend.run_path.kind == "cpu"


def test_an_eval_loop_runs_the_forward_on_the_device(tmp_path: Path) -> None:
    backend = cstorch.backend("CSX", artifact_dir=str(tmp_path))
    torch.manual_seed(0)
    model = tiny.Model()
    twin = tiny.Model()
    twin.load_state_dict(model.state_dict())
    compiled = cstorch.compile(model, backend)
    compiled.eval()
    got: list[float] = []

    @cstorch.trace
    def eval_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.nll_loss(compiled(x), y)

    @cstorch.step_closure
    def keep(loss: torch.Tensor) -> None:
        got.append(loss.item())

    for x, y in cstorch.utils.data.DataExecutor(loader(32)):
        keep(eval_step(x, y))
    with torch.no_grad():
        want = [torch.nn.functional.nll_loss(twin(x), y).item() for x, y in loader(32).streaming().shard_loader]
    assert len(got) == 4 and max(abs(a - b) for a, b in zip(got, want)) <= 1e-6
    [spec] = tmp_path.glob("cs_*/spec.json")
    assert json.loads(spec.read_text())["mode"] == "eval"


def test_a_2x_script_with_csconfig_num_csx_2_trains_as_one_system_at_twice_the_batch(
        no_slurm_env: dict[str, str], tmp_path: Path) -> None:
    """The same 2.x script, CSConfig(num_csx=N) from its argument: N = 2 under csrun_wse --num-csx 2
    (two streamers, one per system) gives one system's losses at the global batch (a lone chief:
    with csrun's sample-level sharding a step of the two streamers' batches of 8 holds the same
    16 samples as the lone chief's batch of 16)."""
    import subprocess
    import sys

    from tests.conftest import BIN

    script = Path(__file__).parent / "scripts" / "cluster_2x.py"
    runs = {1: [str(BIN / "csrun_wse"), "--total-nodes", "1"],
            2: [str(BIN / "csrun_wse"), "--num-csx", "2", "--total-nodes", "5", "--tasks-per-node", "2"]}
    got = {}
    for n, launcher in runs.items():
        done = subprocess.run([*launcher, sys.executable, str(script), str(n), str(tmp_path / f"n{n}")],
                              env={**no_slurm_env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                              timeout=300, cwd=script.parent)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        got[n] = [float(v) for v in (tmp_path / f"n{n}" / "losses.txt").read_text().split()]
    assert len(got[1]) == len(got[2]) == 20 and len(set(got[1])) > 1
    assert max(abs(a - b) / abs(a) for a, b in zip(got[1], got[2])) <= 1e-6
