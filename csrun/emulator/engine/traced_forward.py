"""The engine's forward as a TorchScript trace, so that its ops run without the GIL in between.

The captured program is an FX graph: run as a ``GraphModule`` it is Python code that calls one
aten op after another, and every op returns to Python and takes the GIL back. The embedded
device runs the engine on a thread of the chief's process, beside the user's training loop and
its input pipeline (Python too): on a small model the two threads hand the GIL back and forth
at every op, and each waits for the other (a 10x50 MLP's step took much longer with a DataLoader
iterating beside it: BENCHMARKS.md). A trace of the same graph (``torch.jit.trace``) runs all its ops inside
one call: the engine thread needs the GIL only to start the forward, for the backward's Python
wrapper and the optimizer.

The trace is of the same aten ops in the same order, run by TorchScript's interpreter with its
optimizations off (:mod:`csrun.emulator.engine.torchscript`: no fusion, no symbolic autodiff; autograd
records the same ops as eager), so the numbers are the graph's bit for bit.
:meth:`TracedForward.build` checks that on the first batch before it is used: the graph (the
run that the trace records) and the trace run on copies of the state from the same random state,
and their outputs and their gradients must be equal bit for bit (so the first step runs its
forward and its backward three times each); any difference, or anything the trace cannot express
(a non-tensor input or output, a failed trace), keeps the graph, with the reason at debug level.
Tracing runs on copies, so it moves no buffer and draws nothing from the random generators a
step uses.

``CSRUN_ENGINE_TRACE``: ``auto`` (the default: on a CPU device, for programs run on float32
kernels, including float16/bfloat16 emulated by rounding) or ``off`` (always the graph).
Under autocast (16-bit CPU kernels, or CUDA) the graph runs as captured.

``torch.jit.trace`` is deprecated in torch 2.13 (its warning is silenced here); torch is
pinned, and without it the engine runs the graph.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from typing import Any, Iterator

import torch
from torch.utils import _pytree as pytree

from csrun.env_settings import env_name, env_settings
from csrun.emulator.engine.torchscript import unoptimized
from csrun.program.spec import reads_a_scalar

log = logging.getLogger("csrun.emulator")

ENV = env_name("engine_trace")


def trace_mode() -> str:
    """``CSRUN_ENGINE_TRACE``: ``auto`` (the default) or ``off`` (:mod:`csrun.env_settings`)."""
    return env_settings().engine_trace


def _state_slots(module: torch.fx.GraphModule) -> list[tuple[torch.nn.Module, str, str]]:
    """``(owner, name, kind)`` of every tensor the graph reads through ``get_attr``; kind is
    ``param``, ``buffer`` or ``attr`` (a plain tensor attribute: constants, emulation leaves)."""
    slots: list[tuple[torch.nn.Module, str, str]] = []
    seen: set[str] = set()
    for node in module.graph.nodes:
        if node.op != "get_attr" or node.target in seen:
            continue
        seen.add(str(node.target))
        owner_path, _, name = str(node.target).rpartition(".")
        owner = module.get_submodule(owner_path)
        if name in owner._parameters:
            kind = "param"
        elif name in owner._buffers:
            kind = "buffer"
        else:
            kind = "attr"
        if not isinstance(getattr(owner, name), torch.Tensor):
            raise TypeError(f"get_attr {node.target} is not a tensor")
        slots.append((owner, name, kind))
    return slots


def _read(slot: tuple[torch.nn.Module, str, str]) -> torch.Tensor:
    owner, name, _ = slot
    return getattr(owner, name)


@contextlib.contextmanager
def _swapped(slots: list[tuple[torch.nn.Module, str, str]], tensors: list[torch.Tensor]) -> Iterator[None]:
    """The module reads ``tensors`` in place of its state while inside."""
    before = [_read(s) for s in slots]

    def put(values: list[torch.Tensor]) -> None:
        for (owner, name, kind), value in zip(slots, values):
            if kind == "param":
                owner._parameters[name] = value  # type: ignore[assignment]  # a plain tensor, for this call only
            elif kind == "buffer":
                owner._buffers[name] = value
            else:
                owner.__dict__[name] = value

    put(tensors)
    try:
        yield
    finally:
        put(before)


def _copy(t: torch.Tensor) -> torch.Tensor:
    c = t.detach().clone()
    return c.requires_grad_(t.requires_grad) if t.is_floating_point() or t.is_complex() else c


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and bool(
            torch.equal(a, b) or (a.is_floating_point() and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))
                                  and torch.equal(a.isnan(), b.isnan())))
    return a is None and b is None


class TracedForward:
    """``module(batch)`` through a trace of the graph; build it with :meth:`build`."""

    def __init__(self, fn: Any, slots: list[tuple[torch.nn.Module, str, str]], out_spec: pytree.TreeSpec) -> None:
        self._fn = fn
        self._slots = slots
        self._out_spec = out_spec

    def __call__(self, batch: Any) -> Any:
        """The graph's outputs for ``batch`` (the engine's device tensors), reading the module's current state."""
        leaves = pytree.tree_leaves(batch)
        with unoptimized():
            out = self._fn(*leaves, *[_read(s) for s in self._slots])
        return pytree.tree_unflatten(list(out), self._out_spec)

    @classmethod
    def build(cls, module: torch.fx.GraphModule, batch: Any) -> "TracedForward | None":
        """A checked trace of ``module`` for batches shaped like ``batch``, or None (the graph runs;
        the reason is logged at debug level). Nothing of the module's state or the random
        generators is changed."""
        try:
            return cls._build(module, batch)
        except Exception as exc:  # noqa: BLE001 - any failure: the graph runs as captured
            log.debug("engine: running the captured graph, not a trace (%s: %s)", type(exc).__name__, exc)
            return None

    @classmethod
    def _build(cls, module: torch.fx.GraphModule, batch: Any) -> "TracedForward | None":
        leaves, in_spec = pytree.tree_flatten(batch)
        if not all(isinstance(x, torch.Tensor) for x in leaves):
            raise TypeError("a batch leaf is not a tensor")
        if any(node.op == "call_function" and reads_a_scalar(node.target) for node in module.graph.nodes):
            raise TypeError("the graph reads a tensor's value as a number (aten.item): a trace would freeze it")
        slots = _state_slots(module)
        n = len(leaves)
        runs: list[tuple[tuple[torch.Tensor, ...], pytree.TreeSpec]] = []

        def flat_forward(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
            with _swapped(slots, list(args[n:])):
                out = module(pytree.tree_unflatten(list(args[:n]), in_spec))
            flat, spec = pytree.tree_flatten(out)
            if not all(isinstance(x, torch.Tensor) for x in flat):
                raise TypeError("an output is not a tensor")
            runs.append((tuple(flat), spec))
            return tuple(flat)

        inputs = [*leaves, *[_read(s) for s in slots]]
        rng = torch.random.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
        try:
            with warnings.catch_warnings(), unoptimized():
                warnings.simplefilter("ignore")
                graph_args = [_copy(x) for x in inputs]
                fn = torch.jit.trace(flat_forward, tuple(graph_args), check_trace=False)  # runs the graph once
                graph_out, out_spec = runs[0]
                torch.random.set_rng_state(rng)
                trace_args = [_copy(x) for x in inputs]
                trace_out = fn(*trace_args)
                if not (_agree(graph_out, graph_args, trace_out, trace_args)):
                    log.debug("engine: the trace differs from the captured graph; running the graph")
                    return None
        finally:
            torch.random.set_rng_state(rng)
            if cuda_rng is not None:
                torch.cuda.set_rng_state_all(cuda_rng)
        return cls(fn, slots, out_spec)


def _gradients(outputs: tuple[torch.Tensor, ...], args: list[torch.Tensor]) -> list[torch.Tensor | None]:
    wants = [o for o in outputs if o.requires_grad]
    if wants:
        torch.autograd.backward(wants, [torch.ones_like(o) for o in wants])
    return [a.grad for a in args]


def _agree(graph_out: tuple[torch.Tensor, ...], graph_args: list[torch.Tensor],
           trace_out: tuple[torch.Tensor, ...], trace_args: list[torch.Tensor]) -> bool:
    """The graph's and the trace's outputs and gradients (of every output, on copies), bit for bit."""
    if len(graph_out) != len(trace_out) or not all(_same(a, b) for a, b in zip(graph_out, trace_out)):
        return False
    return all(_same(a, b) for a, b in zip(_gradients(graph_out, graph_args), _gradients(trace_out, trace_args)))
