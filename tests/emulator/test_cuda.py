"""The engine on a CUDA device (skipped where none is visible): state resident there, values back on CPU."""

from __future__ import annotations

import pytest
import torch

from csrun.compiler.spec import LossScalingSpec, OptimizerSpec
from csrun.emulator.embedded import EmbeddedDevice
from csrun.emulator.engine import Engine

from .helpers import TinyTransformer, lm_batches, make_program, quiet

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
    from csrun.emulator.server_warmup import warm_up

    thread = warm_up("cuda")
    thread.join(timeout=120)
    assert not thread.is_alive() and torch.cuda.is_initialized()
