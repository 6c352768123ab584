"""The compiled step replayed as a CUDA graph: one launch for a step's forward and backward.

A step the engine runs on a CUDA device is known ahead of time: the captured program with
static shapes, weights resident on the device. After :data:`WARMUP_STEPS` steps run as they
always do (on a side stream, as torch's whole-network capture asks: cuBLAS and cuDNN settle,
lazily made state exists), the next step is captured into a ``torch.cuda.CUDAGraph`` and every
later step replays it: the batch is copied into the graph's static input buffers (through pinned
host buffers, asynchronously), one replay runs every kernel of the step's forward and backward,
and the outputs a closure reads are copies of the graph's static outputs.

**What the graph holds, and what stays outside.** The graph holds what the engine calls the
step's *body* (:class:`StepGraph`'s ``body``): the forward, the loss scaling (the scale is a
device tensor the engine sets before a replay when it changed, so dynamic scaling needs no new
capture) and the backward, which leaves the gradients in the graph's own buffers. The update
after it — unscaling and the overflow check, clipping, the optimizer with the schedule's rate,
the loss-scale update — runs after the replay exactly as it runs without a graph
(:meth:`~csrun.emulator.engine.executor.Engine._update`: torch's foreach kernels, a few launches
for the whole model). That is a choice of numbers over launches: a captured kernel keeps the
scalars it was launched with, so a learning rate, an Adam bias correction or a loss scale that
changes every step would have to come from a device tensor instead, and torch's update kernels
take those as Python scalars (``add_(g, alpha=-lr)`` is one fused multiply-add; the same
arithmetic with a tensor rounds twice). Inside the graph every value is computed as the step
without a graph computes it — the same kernels, and the loss scaling a multiply by a float32
tensor holding the scale, exact where the plain step multiplies by the Python scalar (or skips a
scale of 1) — so a float32 run is meant to give the same bits with and without the graph, and as
eager PyTorch's (checked on a CPU for the body; the replays' check needs a GPU).

**Which steps replay.** Training steps with a backward that start without held gradients, and
eval steps. The first step of a gradient accumulation replays; its later micro-steps add to the
held gradients and run without the graph, as do steps without a backward.

**What it cannot hold.** The first warm-up step runs under a check
(:func:`~csrun.emulator.engine.graph_check.graph_blocker`) that
names the first op a graph cannot replay: one that reads a value back to the host (``.item()``,
``bool(tensor)``), one whose output shape depends on the data (``nonzero``, indexing with a
boolean mask) or that writes through a boolean mask, one that runs with a tensor on another
device (a copy to or from the CPU; a CPU scalar that is only read is a kernel argument and
fine). Such a program, a batch with a value that is not a tensor (the graph would keep the first
one), or a capture that fails (what the check cannot see: an op that synchronizes inside its
kernel, a higher-order op's body) runs every step without a graph, after one notice naming why.
A batch whose shapes differ from the captured ones runs without the graph (one notice).

**16-bit compute.** A capture needs autocast's cast cache off, so an engine with a graph casts
a weight at each 16-bit read on every step, graphed or not: a weight that two 16-bit ops read
sums its two gradients in float32, where the cache (eager autocast, ``CSRUN_CUDA_GRAPH=off``)
sums them in 16 bits. Float32 programs are not affected.

**Memory.** The graph keeps its activations in a pool of its own for the whole run; the warm-up
steps' cached blocks are given back before the capture.

On a CPU there is no graph: :class:`StepGraph` runs the body as it is, every step (how the tests
check the graph's step arithmetic against the step without it on a machine without a GPU).
``CSRUN_CUDA_GRAPH``: ``auto`` (the default: graphs on a CUDA device) or ``off``.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

from csrun.emulator.engine.graph_check import graph_blocker
from csrun.env_settings import env_name, env_settings

log = logging.getLogger("csrun.emulator")

ENV = env_name("cuda_graph")
WARMUP_STEPS = 3
"""Steps run without a graph before the capture (torch's ``make_graphed_callables`` default)."""

Outputs = tuple[dict[str, Any], list[torch.Tensor | None]]
"""What a step's body gives: the outputs handed out, and the state it writes (the gradients)."""
Body = Callable[[Any], Outputs]
"""A step's body: its device inputs -> :data:`Outputs`."""


def graph_mode() -> str:
    """``CSRUN_CUDA_GRAPH``: ``auto`` (the default) or ``off`` (:mod:`csrun.env_settings`)."""
    return env_settings().cuda_graph


def _signature(leaves: list[Any], tree: Any) -> tuple[Any, ...]:
    """What a captured graph fixes of a batch: its structure and each tensor's shape and dtype."""
    return (tree, tuple((tuple(t.shape), t.dtype) for t in leaves))


class _InputStage:
    """The graph's static input buffers on the device, filled from two alternating sets of pinned
    host buffers (a set is written again only once its last copy to the device is done)."""

    def __init__(self, leaves: list[torch.Tensor], device: torch.device) -> None:
        self.device = device
        self.on_device = [torch.empty(t.shape, dtype=t.dtype, device=device) for t in leaves]
        self._pinned = [[torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in leaves] for _ in range(2)]
        self._copied: list[torch.cuda.Event | None] = [None, None]
        self._turn = 0

    def fill(self, leaves: list[torch.Tensor]) -> None:
        """Copy a batch's tensors into the static buffers, on the device's current stream (the
        replay's, after them)."""
        turn = self._turn
        self._turn ^= 1
        copied = self._copied[turn]
        if copied is not None:
            copied.synchronize()
        for host, leaf, dev in zip(self._pinned[turn], leaves, self.on_device):
            if leaf.device.type == "cpu":
                host.copy_(leaf)
                dev.copy_(host, non_blocking=True)
            else:
                dev.copy_(leaf, non_blocking=True)
        event = torch.cuda.Event()
        event.record(torch.cuda.current_stream(self.device))
        self._copied[turn] = event


class StepGraph:
    """One program's step as a CUDA graph: warm-up, capture, replay (the module docstring)."""

    def __init__(self, body: Body, device: torch.device, notice: Callable[[str], None], *,
                 reset: Callable[[], None], warmup: int = WARMUP_STEPS) -> None:
        """``body``: the step's body (:data:`Body`), run on the device inputs; ``reset``: undo
        what a failed capture left (the gradients it assigned) before the step runs without it;
        ``warmup``: steps before the capture."""
        self.body = body
        self.device = device
        self.notice = notice
        self.reset = reset
        self.warmup = warmup
        self.off: str | None = None if device.type == "cuda" else "no CUDA device"
        """Why steps run without a graph (None: they run with one, once captured)."""
        self.steps = 0
        """Steps run through :meth:`run`."""
        self.replays = 0
        """Steps the graph replayed."""
        self._graph: torch.cuda.CUDAGraph | None = None
        self._stage: _InputStage | None = None
        self._signature: tuple[Any, ...] | None = None
        self._static: Outputs | None = None
        self._side: torch.cuda.Stream | None = None  # the warm-up steps' stream, then the capture's
        self._said_shapes = False

    @property
    def captured(self) -> bool:
        """Whether a graph was captured and replays the steps."""
        return self._graph is not None and self.off is None

    def run(self, leaves: list[Any], tree: Any) -> Outputs:
        """Run one step on a batch's leaves (host or device tensors, checked against the program)
        and its structure: eagerly while warming up or without a graph, else by replaying the
        graph (capturing it first). Returns the body's outputs (the caller's to keep) and the
        state it wrote (the graph's own buffers after a replay: valid until the next one)."""
        self.steps += 1
        if self.off is not None:
            return self._eager(leaves, tree)
        with torch.cuda.device(self.device):  # whatever device the calling thread has current
            return self._run(leaves, tree)

    def _run(self, leaves: list[Any], tree: Any) -> Outputs:
        path = next((i for i, t in enumerate(leaves) if not isinstance(t, torch.Tensor)), None)
        if path is not None:
            self._stop(f"the batch's item {path} is a {type(leaves[path]).__name__}, not a tensor: a graph would keep "
                       f"its first value")
            return self._eager(leaves, tree)
        if self.steps <= self.warmup:
            return self._warm(leaves, tree, check=self.steps == 1)
        if self._graph is None:
            return self._capture(leaves, tree)
        if _signature(leaves, tree) != self._signature:
            if not self._said_shapes:
                self._said_shapes = True
                self.notice("CUDA graph: a batch's shapes or dtypes differ from the captured ones; such steps run "
                            "without the graph")
            return self._eager(leaves, tree)
        return self._replay(leaves)

    def _inputs(self, leaves: list[Any], tree: Any) -> Any:
        """The batch on the device, as the body takes it."""
        moved = [t.to(self.device, non_blocking=True) if isinstance(t, torch.Tensor) else t for t in leaves]
        return pytree.tree_unflatten(moved, tree)

    def _eager(self, leaves: list[Any], tree: Any) -> Outputs:
        return _copies(self.body(self._inputs(leaves, tree)))

    def _stream(self) -> torch.cuda.Stream:
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        return self._side

    def _warm(self, leaves: list[Any], tree: Any, *, check: bool) -> Outputs:
        """A warm-up step on a side stream (torch's rule before a capture), the first one watched
        for ops a graph cannot hold. What it leaves for the caller is marked used on the caller's
        stream, so that the side stream cannot reuse its memory while the update reads it."""
        here = torch.cuda.current_stream(self.device)
        side = self._stream()
        side.wait_stream(here)
        with torch.cuda.stream(side):
            inputs = self._inputs(leaves, tree)
            if check:
                result, reason = graph_blocker(lambda: self.body(inputs), self.device)
                if reason is not None:
                    self._stop(reason)
            else:
                result = self.body(inputs)
        here.wait_stream(side)
        for t in [*pytree.tree_leaves(result[0]), *result[1]]:
            if isinstance(t, torch.Tensor) and t.device.type == "cuda":
                t.record_stream(here)
        return _copies(result)

    def _capture(self, leaves: list[Any], tree: Any) -> Outputs:
        """Capture the body on static inputs filled with this batch, then replay it for this step.

        The capture is driven by hand (what ``torch.cuda.graph`` does) so that a failed one ends
        cleanly (:meth:`_after_failed_capture`): the stream is given back whatever happens, a
        capture that could not end has its memory pool closed (torch leaves it open then, and
        the allocator would think a capture still runs), and the random generator leaves capture
        mode (the steps without a graph draw dropout masks outside a capture)."""
        stage = _InputStage(leaves, self.device)
        stage.fill(leaves)
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()  # the cached blocks of the warm-up steps, free for the graph's pool
        graph = torch.cuda.CUDAGraph()
        pool = torch.cuda.graph_pool_handle()
        failure: BaseException | None = None
        begun = ended = False
        static: Outputs | None = None
        side = self._stream()
        with torch.cuda.stream(side):
            try:
                graph.capture_begin(pool=pool, capture_error_mode="thread_local")
                begun = True
                static = self.body(pytree.tree_unflatten(list(stage.on_device), tree))
            except Exception as exc:  # noqa: BLE001 - any capture failure: the steps run without a graph
                failure = exc
            if begun:
                try:
                    graph.capture_end()
                    ended = True
                except Exception as exc:  # noqa: BLE001 - the capture was invalidated (a sync, a host read)
                    failure = failure or exc
        if failure is not None:
            self.reset()  # the gradients the capture assigned, in its pool
            del graph, stage, static
            self._after_failed_capture(pool, close_pool=not ended)  # a failed begin may have opened it too
            first = str(failure).strip().splitlines()[0] if str(failure).strip() else ""
            self._stop(f"the capture failed ({type(failure).__name__}: {first})")
            return self._eager(leaves, tree)
        torch.cuda.current_stream(self.device).wait_stream(side)  # what the capture's prologue wrote, before a replay
        assert static is not None  # noqa: S101 - the body returned
        self._graph, self._stage, self._static = graph, stage, static
        self._signature = _signature(leaves, tree)
        log.info("CUDA graph: the step was captured after %d warm-up steps", self.warmup)
        return self._replay(leaves, filled=True)

    def _after_failed_capture(self, pool: Any, *, close_pool: bool) -> None:
        """What a failed capture leaves, undone: its memory pool (``close_pool``: it did not end)
        and the random generator's capture mode. torch ends a capture's generator state only in
        a capture that ends; left in capture mode, every later dropout outside a graph fails
        ("Offset increment outside graph capture"). A throwaway capture of one kernel on the same
        stream begins and ends it again (harmless where torch already reset it)."""
        if close_pool:
            _close_pool(self.device, pool)
        try:
            throwaway = torch.cuda.CUDAGraph()
            with torch.cuda.stream(self._stream()):
                throwaway.capture_begin(capture_error_mode="thread_local")
                torch.zeros(1, device=self.device)
                throwaway.capture_end()
            del throwaway
        except Exception as exc:  # noqa: BLE001 - the device is failing: the plain step will say so
            log.debug("CUDA graph: the capture that resets the generator failed: %s", exc)
        torch.cuda.synchronize(self.device)

    def _replay(self, leaves: list[torch.Tensor], *, filled: bool = False) -> Outputs:
        """Fill the static inputs (unless the capture just did), replay, hand the outputs out."""
        graph, stage, static = self._graph, self._stage, self._static
        assert graph is not None and stage is not None and static is not None  # noqa: S101 - captured
        if not filled:
            stage.fill(leaves)
        graph.replay()
        self.replays += 1
        return _copies(static)  # the next replay overwrites the static outputs

    def _stop(self, reason: str) -> None:
        """Run every later step without a graph, after one notice naming why."""
        self.off = reason
        self._graph = self._stage = self._static = None
        say_without_graph(self.notice, reason)


def say_without_graph(notice: Callable[[str], None], reason: str) -> None:
    """The one notice of a program whose steps run without a graph, naming why."""
    notice(f"CUDA graph: the step runs without a graph: {reason}")


def _copies(result: Outputs) -> Outputs:
    """The body's outputs as copies (one may alias a weight the update changes, or a static
    output the next replay overwrites), with its state as it is."""
    outputs, state = result
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in outputs.items()}, list(state)


def _close_pool(device: torch.device, pool: Any) -> None:
    """End the allocations to ``pool`` and release it, after a capture that could not end
    (torch's private allocator calls; best effort). The pool is released only when this call
    ended its allocations: if torch had ended them (a graph that failed to instantiate), the
    graph released it too, and a second release would break the allocator's count; a pool
    kept is memory, a pool released twice is an assertion at the next ``empty_cache``."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        torch._C._cuda_endAllocateToPool(index, pool)
    except Exception as exc:  # noqa: BLE001 - torch ended it already, or has no such call: keep the pool
        log.debug("CUDA graph: the pool after a failed capture stays (%s)", exc)
        return
    try:
        torch._C._cuda_releasePool(index, pool)
    except Exception as exc:  # noqa: BLE001 - nothing more to do than say so at debug level
        log.debug("CUDA graph: releasing the pool after a failed capture: %s", exc)
