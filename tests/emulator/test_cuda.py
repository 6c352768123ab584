"""The engine on a CUDA device (skipped where none is visible): state resident there, values back on CPU."""

from __future__ import annotations

import pytest
import torch

from csrun.compiler.spec import LossScalingSpec, OptimizerSpec
from csrun.emulator.embedded import EmbeddedDevice
from csrun.emulator.engine.executor import Engine

from tests.tiny_models import TinyTransformer, lm_batches
from .helpers import make_program, quiet

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device visible")


class WithConstant(torch.nn.Module):
    """A model with a lifted tensor constant (a plain attribute in the unlifted module)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.scale = torch.tensor([1.0, 2.0, 3.0, 4.0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.lin(x) * self.scale).pow(2).mean()


@pytest.mark.parametrize("device", ["cuda", "cuda:0"])
def test_cuda_matches_cpu_and_keeps_state_on_the_device(device: str) -> None:
    batches = lm_batches(10)
    ep, spec = make_program(TinyTransformer(), batches[0], optimizer=OptimizerSpec(type="adamw"),
                            learning_rate={"scheduler": "Linear", "initial_learning_rate": 0.01,
                                           "end_learning_rate": 0.0, "steps": 10})
    cpu = Engine(ep, spec, notice=quiet)
    gpu = Engine(ep, spec, device, notice=quiet)
    assert all(p.is_cuda for p in gpu.params) and gpu.global_step.is_cuda
    for b in batches:
        a = cpu.run_step(b)["loss"].item()
        out = gpu.run_step(b)
        assert out["loss"].is_cuda
        assert out["loss"].item() == pytest.approx(a, rel=1e-4)
    st = gpu.state_dict()
    assert all(t.device.type == "cpu" for t in st["params"].values())
    assert all(v.device.type == "cpu" for s in st["optimizer"]["state"].values() for v in s.values()
               if isinstance(v, torch.Tensor))
    fresh = Engine(ep, spec, device, notice=quiet)
    fresh.load_state_dict(st)
    assert fresh.step == 10 and all(p.is_cuda for p in fresh.params)


def test_cuda_mixed_precision_overflow_and_constants() -> None:
    x = torch.randn(8, 4)
    ep, spec = make_program(WithConstant(), x, precision="float16", optimizer=OptimizerSpec(type="sgd"),
                            loss_scaling=LossScalingSpec(factor="dynamic", initial_loss_scale=2.0**8))
    with EmbeddedDevice(device="cuda", notice=quiet) as dev:
        dev.load(ep, spec)
        good = dev.submit(x).result()
        bad_x = x.clone()
        bad_x[0, 0] = float("inf")
        bad = dev.submit(bad_x).result()
        after = dev.submit(x).result()
    assert good["loss"].device.type == "cpu"
    assert bad["loss_scale"].item() == 2.0**8 and after["loss_scale"].item() == 2.0**7
    for dtype_name in ("cbfloat16", "bfloat16"):
        ep2, spec2 = make_program(WithConstant(), x, precision=dtype_name)
        assert Engine(ep2, spec2, "cuda", notice=quiet).run_step(x)["loss"].isfinite()


class Positions(torch.nn.Module):
    """Position ids made in the forward on the input's device (BERT's embeddings do this)."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = torch.nn.Embedding(32, 8)
        self.pos = torch.nn.Embedding(16, 8)
        self.out = torch.nn.Linear(8, 32)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        ids = batch["input_ids"]
        positions = torch.arange(ids.shape[1], device=ids.device)
        h = self.tok(ids) + self.pos(positions)[None]
        return torch.nn.functional.cross_entropy(self.out(h).flatten(0, 1), batch["labels"].flatten())


def test_tensors_the_forward_creates_are_made_on_the_gpu() -> None:
    g = torch.Generator().manual_seed(0)
    batches = [{"input_ids": torch.randint(0, 32, (4, 16), generator=g),
                "labels": torch.randint(0, 32, (4, 16), generator=g)} for _ in range(5)]
    ep, spec = make_program(Positions(), batches[0], optimizer=OptimizerSpec(type="adamw"))
    cpu = Engine(ep, spec, notice=quiet)
    gpu = Engine(ep, spec, "cuda", notice=quiet)
    for b in batches:
        assert gpu.run_step(b)["loss"].item() == pytest.approx(cpu.run_step(b)["loss"].item(), rel=1e-4)


def test_the_servers_warm_up_readies_the_gpu() -> None:
    from csrun.emulator.remote.server_warmup import warm_up

    thread = warm_up("cuda")
    thread.join(timeout=120)
    assert not thread.is_alive() and torch.cuda.is_initialized()


def _script_loop(cs_ip: str | None, model_dir: str, device: str = "cpu") -> tuple[list[float], dict[str, torch.Tensor]]:
    """A loop with what issue 30 carried into the program: two param groups, clip_grad_norm_, an
    eval forward after optimizer.step() with BatchNorm; float32, 6 steps; (values, state)."""
    import csrun.torch as cbtorch
    from csrun.compiler import CompileSettings
    from csrun.torch import backend as backend_mod
    from csrun.torch import process_state
    from csrun.driver.driver import DeviceDriver

    process_state.reset_for_tests()
    backend_mod.register_device_backend(DeviceDriver)
    torch.manual_seed(0)
    cbtorch.initialize(cs_ip, settings=CompileSettings(mixed_precision=False), model_dir=model_dir, device=device)
    model = cbtorch.module(torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                               torch.nn.Linear(16, 3)))
    opt = cbtorch.optimizer(torch.optim.SGD([{"params": model[0].parameters(), "lr": 0.1},
                                             {"params": list(model[1].parameters()) + list(model[3].parameters()),
                                              "lr": 0.4, "momentum": 0.9, "weight_decay": 0.01}], lr=0.1))
    g = torch.Generator().manual_seed(1)
    x = torch.randn(48, 6, generator=g)
    data = torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long())
    loader = cbtorch.dataloader(torch.utils.data.DataLoader(data, batch_size=8, drop_last=True))
    values: list[float] = []
    with cbtorch.Session(loader):
        for xb, yb in loader:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            model.eval()
            with torch.no_grad():
                val = torch.nn.functional.cross_entropy(model(xb), yb)
            model.train()
            cbtorch.add_step_closure(lambda *v: values.extend(t.detach().item() for t in v), (loss, norm, val))
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    process_state.reset_for_tests()
    return values, state


def test_groups_clipping_and_a_forward_after_the_update_on_the_gpu(tmp_path) -> None:
    """The device on a GPU trains the script's groups, clipping and post-update forward as eager
    on the CPU does (the first step checked against eager too: csrun.driver.verify)."""
    cpu_values, cpu_state = _script_loop(None, str(tmp_path / "cpu"))
    gpu_values, gpu_state = _script_loop("embedded", str(tmp_path / "gpu"), device="cuda")
    assert gpu_values == pytest.approx(cpu_values, rel=1e-4, abs=1e-6)
    for name, want in cpu_state.items():
        assert torch.allclose(gpu_state[name].to(want.dtype), want, rtol=1e-4, atol=1e-6), name
