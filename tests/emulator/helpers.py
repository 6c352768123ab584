"""Programs, specs, engines and an eager reference loop for the emulator tests (the models are
tests/tiny_models.py's)."""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Callable, Iterator

import torch
from torch import nn

from csrun.compiler.spec import LossScalingSpec, OptimizerSpec, ProgramSpec, TensorSpec
from csrun.emulator.engine.executor import Engine
from csrun.emulator.remote.guard import GuardLimits
from csrun.emulator.remote.server import EmulatorServer
from csrun.program.archive import import_reader


def make_spec(**spec_kw: Any) -> ProgramSpec:
    """A train spec: float32, SGD, lr 0.01 unless given."""
    kw: dict[str, Any] = dict(optimizer=OptimizerSpec(type="sgd", hyperparameters={}), learning_rate=0.01,
                              precision="float32")
    kw.update(spec_kw)
    return ProgramSpec(**kw)


def make_program(model: nn.Module, batch: Any, **spec_kw: Any) -> tuple[torch.export.ExportedProgram, ProgramSpec]:
    """Export ``model`` on ``batch`` (its forward(batch) returns the loss) and build a spec."""
    return torch.export.export(model, (batch,)), make_spec(**spec_kw)


def eager_losses(model: nn.Module, batches: list[Any], make_opt: Callable[[list], torch.optim.Optimizer],
                 lr_at: Callable[[int], float], *, autocast: torch.dtype | None = None) -> tuple[list[float], nn.Module]:
    """Train a copy of ``model`` eagerly; returns the losses and the trained copy."""
    m = copy.deepcopy(model)
    opt = make_opt(list(m.parameters()))
    losses = []
    for step, b in enumerate(batches):
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        with torch.autocast("cpu", dtype=autocast, enabled=autocast is not None):
            out = m(b)
        loss = out[0] if isinstance(out, tuple) else out
        opt.zero_grad()
        loss.float().backward()
        opt.step()
        losses.append(loss.item())
    return losses, m


def input_specs(batch: Any) -> tuple[TensorSpec, ...]:
    """The spec's input schema for ``batch`` (leaves in pytree order)."""
    from torch.utils import _pytree as pytree

    leaves, _ = pytree.tree_flatten_with_path(batch)
    return tuple(TensorSpec(path=pytree.keystr(p), dtype=str(t.dtype).removeprefix("torch."), shape=tuple(t.shape))
                 for p, t in leaves)


def raw_hello(sock: Any, token: str, job: str) -> dict[str, Any]:
    """The client's side of the hello on a raw socket (no keep-alives follow); returns the server's answer."""
    from csrun.emulator.remote import handshake, wire

    greeting, _ = wire.recv_frame(sock, wire.Limits())
    if greeting.get("op") != "challenge":
        return greeting
    wire.send_frame(sock, handshake.hello(token.encode(), greeting["nonce"], job))
    answer, _ = wire.recv_frame(sock, wire.Limits())
    return answer


def quiet(_msg: str) -> None:
    """A notice sink."""


def make_engine(model: nn.Module, batch: Any, precision: str, hp: dict[str, Any] | None = None,
                scale: float | str = 1.0, *, optimizer: str = "sgd", **spec_kw: Any) -> Engine:
    """An engine for ``model`` exported on ``batch`` (seed 0): ``optimizer`` with ``hp``, loss scale
    ``scale`` (a number or ``"dynamic"``), other spec fields from ``spec_kw``."""
    torch.manual_seed(0)
    program, spec = make_program(model, batch, precision=precision,
                                 optimizer=OptimizerSpec(type=optimizer, hyperparameters=dict(hp or {})),
                                 loss_scaling=LossScalingSpec(factor=scale), **spec_kw)
    return Engine(program, spec, notice=quiet)


__all__ = ["make_program", "make_spec", "eager_losses", "quiet", "make_engine", "raw_hello", "input_specs",
           "OptimizerSpec", "ProgramSpec", "LossScalingSpec", "adamw_no_bias_correction_per_tensor"]


def adamw_no_bias_correction_per_tensor(params: list[torch.Tensor], state: dict[int, list[torch.Tensor]],
                                        lr: float, wd: float, eps: float, betas: tuple[float, float]) -> None:
    """AdamW without bias correction (csrun's ``AdamWNoBiasCorrection``), one parameter at a time:
    the reference for its foreach step (tests) and its per-tensor cost (bench/emulator/lean_step.py).
    ``state`` maps ``id(p)`` to ``[m, v]``, created as zeros when missing."""
    b1, b2 = betas
    with torch.no_grad():
        for p in params:
            if p.grad is None:
                continue
            m, v = state.setdefault(id(p), [torch.zeros_like(p), torch.zeros_like(p)])
            m.mul_(b1).add_(p.grad, alpha=1 - b1)
            v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
            p.addcdiv_(m, v.sqrt().add_(eps), value=-lr)
            if wd != 0:
                p.add_(p, alpha=-lr * wd)


@contextlib.contextmanager
def serve(*, token: str, tls: Any = None, wait_per_job: float | None = None, **guard: Any) -> Iterator[EmulatorServer]:
    """A server on a free loopback port with the given connection limits (``GuardLimits`` keywords)
    and queue allowance per job (None: the default)."""
    import_reader()  # before the warm-up thread imports it (see tests/emulator/conftest.py)
    queue = {} if wait_per_job is None else {"wait_per_job": wait_per_job}
    srv = EmulatorServer(token=token, port=0, connection_limits=GuardLimits(**guard), tls=tls, **queue)
    srv.start()
    try:
        yield srv
    finally:
        srv.shutdown()


def addr(srv: EmulatorServer) -> str:
    """``127.0.0.1:<port>`` of a server from :func:`serve`."""
    return f"127.0.0.1:{srv.address[1]}"
