"""The same loop on the CPU path (eager PyTorch) and on the device, compared bit for bit: the
models, data and harness of the issue-30 tests (tests/device/test_no_silent_difference*.py).
The two models here are shaped for those tests; the plain ones are tests/tiny_models.py's."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

import csrun.torch as cbtorch
from csrun.compiler import CompileSettings
from csrun.compiler.errors import CompileFailed
from csrun.torch import process_state as state_mod

STEPS = 8
F32 = CompileSettings(mixed_precision=False)


class Marks:
    """The lines of a file marked ``# L:<marker>`` (where a refusal must point)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.source = Path(path).read_text().splitlines()

    def line(self, marker: str) -> int:
        """The line that ends with ``# L:<marker>``."""
        [n] = [i for i, text in enumerate(self.source, 1) if text.rstrip().endswith(f"# L:{marker}")]
        return n

    def at(self, marker: str) -> str:
        """``file:line: ``, the prefix of csrun's refusals about that line."""
        return f"{self.path}:{self.line(marker)}: "


MARKS = Marks(__file__)
"""This module's marked lines (``plain_step``'s ``optimizer.step()``)."""


def found(exc: BaseException, cls: type[BaseException]) -> BaseException | None:
    """``exc`` or the problem/cause inside it that is a ``cls``."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, cls):
            return seen
        if isinstance(seen, CompileFailed):
            for p in seen.problems:
                if isinstance(p, cls):
                    return p
        seen = seen.__cause__ or seen.__context__
    return None


class Stack(nn.Sequential):
    """Linear layers with tanh between them; ``model[i]`` is layer i. Shaped for this harness's
    tests: optimizers whose param groups are built layer by layer."""

    def __init__(self, *widths: int) -> None:
        super().__init__(*(nn.Linear(a, b) for a, b in zip(widths, widths[1:])))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self):
            x = layer(x if i == 0 else torch.tanh(x))
        return x


class Switch(nn.Module):
    """Two heads; the Python attribute ``use_b`` picks one. Shaped for this harness's tests of
    Python state the forward reads (and, subclassed, changes)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 3), nn.Linear(6, 3)
        self.use_b = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) if not self.use_b else self.b(x)


def data(n: int = 8 * STEPS) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g)
    return TensorDataset(x, (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long())


@dataclass
class Run:
    """What one run left: values read in closures, the weights, the groups' lrs, the global step."""

    losses: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    initial: dict[str, torch.Tensor] = field(default_factory=dict)
    lrs: list[float] = field(default_factory=list)
    global_step: int = -1
    extra: dict[str, Any] = field(default_factory=dict)


Body = Callable[[int, nn.Module, Any, torch.Tensor, torch.Tensor, Run], None]


def keep(into: list[float], value: torch.Tensor) -> None:
    """Append ``value``'s float in a step closure."""
    cbtorch.add_step_closure(lambda v: into.append(v.detach().item()), (value,))


def sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def run(cs_ip: str | None, model_dir: Path, body: Body, *, model: Callable[[], nn.Module] = lambda: Stack(6, 16, 3),
        optimizer: Callable[[nn.Module], torch.optim.Optimizer] = sgd, scheduler: Callable[[Any], Any] | None = None,
        settings: CompileSettings = F32, steps: int = STEPS) -> Run:
    """``body(step, model, optimizer, x, y, run)`` for ``steps`` batches on ``cs_ip`` (None: the CPU path)."""
    state_mod.reset_for_tests()
    torch.manual_seed(1)
    where = model_dir / ("cpu" if cs_ip is None else "dev")
    cbtorch.initialize(cs_ip, settings=settings, model_dir=str(where))
    m = cbtorch.module(model())
    opt = cbtorch.optimizer(optimizer(m))
    sched = scheduler(opt) if scheduler is not None else None
    loader = cbtorch.dataloader(DataLoader(data(8 * steps), batch_size=8, drop_last=True))
    out = Run(initial=snapshot(m))
    with cbtorch.Session(loader, report=False):
        for step, (x, y) in enumerate(loader):
            body(step, m, opt, x, y, out)
            if sched is not None:
                sched.step()
    assert bool(list(where.glob("cs_*/program.pt2"))) == (cs_ip is not None)  # the device path compiled
    out.state = snapshot(m)
    out.lrs = [g["lr"] for g in opt.state_dict()["param_groups"]]
    out.global_step = cbtorch.global_step()
    return out


def both(tmp_path: Path, body: Body, **kw: Any) -> tuple[Run, Run]:
    """The CPU path's run and the device's."""
    return run(None, tmp_path, body, **kw), run("embedded", tmp_path, body, **kw)


def assert_bitwise(cpu: Run, dev: Run, steps: int = STEPS) -> None:
    """Losses, closure values, every state_dict entry and each group's lr: equal, not close."""
    assert len(cpu.losses) == steps
    assert dev.losses == cpu.losses
    assert dev.values == cpu.values
    assert dev.state.keys() == cpu.state.keys()
    for name, want in cpu.state.items():
        assert torch.equal(dev.state[name], want), (name, (dev.state[name] - want).abs().max())
    assert dev.lrs == cpu.lrs
    assert dev.global_step == cpu.global_step


def plain_step(step: int, model: nn.Module, opt: Any, x: torch.Tensor, y: torch.Tensor, out: Run) -> None:
    opt.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()  # L:plain-step
    keep(out.losses, loss)


# --------------------------------------------------------------------------------------------
# 1. param groups


def two_sgd_groups(m: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD([{"params": m[0].parameters(), "lr": 0.1, "weight_decay": 0.0},
                            {"params": m[1].parameters(), "lr": 0.5, "weight_decay": 0.1, "momentum": 0.9}], lr=0.1)
