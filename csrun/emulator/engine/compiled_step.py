"""The whole training step as one compiled graph: forward, loss, backward, unscaling, the overflow
check, clipping and the optimizer's update of the resident weights and state.

``CSRUN_COMPILED_STEP`` chooses it (:func:`compiled_mode`): ``off`` (the default) runs each step
as today, op by op, bit for bit eager PyTorch; ``on`` compiles the step with inductor (fused
kernels: the update and the backward's elementwise work in a few loops); ``graph`` runs the
same captured whole-step graph without inductor's code generation (the numerics of the capture,
in seconds instead of a compile: for checking it).

How (:class:`CompiledStep`): the engine's captured program is called functionally
(``torch.func.functional_call`` with the trainable weights and the buffers as arguments), its
gradients taken by ``torch.func.grad``, and the update written out for SGD, Adam and AdamW from
the same formulas as ``torch.optim``'s. ``make_fx`` turns that function into one graph whose
in-place writes to the weights, the buffers and the optimizer's state tensors are the engine's
own tensors: ``state_dict()``, checkpoints and the check against eager see them as they see
today's. The learning rate of each group, Adam's bias corrections (computed on the host from
the step count, as ``torch.optim`` computes them) and the loss scale are tensor inputs, so a
schedule, a hand-set learning rate or a scale change never compiles again; the clipping of a
step (the loop's own may change) and the groups' other hyperparameters (a momentum the script
sets) key a graph of their own.

What it promises: the update of a step equals eager's within float32 rounding, not bit for bit
(inductor reorders reductions; the bias corrections round once more). A weight whose exact
gradient is zero (a bias before a normalisation) may take Adam steps of another sign, as in
any two float32 runs that round differently: compare losses, not such weights.

What it holds (:func:`why_not`, one notice naming the reason otherwise, and today's path): a
float32 training program on the CPU whose optimizer is ``SGD``, ``Adam`` or ``AdamW`` (no
``amsgrad``, ``maximize``, tensor learning rate), every trainable weight reached by the backward
(seen at the first step, which runs on today's path: the step the check compares), clipping by
norm or by value, static or dynamic loss scaling; per step: a whole step (backward, update,
gradients cleared); a step that keeps its gradients (accumulation) or reports them (the check)
runs on today's path.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from csrun.env_settings import env_settings

log = logging.getLogger("csrun.emulator")

OPTIMIZERS: tuple[type[torch.optim.Optimizer], ...] = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)
"""The optimizers whose update the compiled step writes out (exactly these classes)."""

_BACKENDS = {"on": "inductor", "graph": "aot_eager"}


def backend_of(mode: str) -> str:
    """The ``torch.compile`` backend of a :func:`compiled_mode` other than ``off``."""
    return _BACKENDS[mode]


def compiled_mode() -> str:
    """``CSRUN_COMPILED_STEP``: ``off`` (the default), ``on`` or ``graph`` (:mod:`csrun.env_settings`)."""
    return env_settings().compiled_step


@dataclass(frozen=True)
class Clip:
    """A step's clipping, as the compiled graph fixes it."""

    max_norm: float | None
    max_value: float | None
    norm_type: float


@dataclass(frozen=True)
class StepResult:
    """What a compiled step hands back (device tensors)."""

    loss: torch.Tensor
    extra: dict[str, Any]
    overflow: torch.Tensor
    """A bool tensor: the gradients were not finite and the update was skipped (dynamic scaling)."""
    grad_norm: torch.Tensor | None


def why_not(optimizer: torch.optim.Optimizer | None, *, precision: str, device: torch.device, half: bool,
            split: bool) -> str:
    """Why a program cannot run as a compiled step ("" when it can)."""
    if optimizer is None:
        return "it does not train"
    if type(optimizer) not in OPTIMIZERS:
        return f"its optimizer is {type(optimizer).__name__} (compiled: SGD, Adam, AdamW)"
    for group in optimizer.param_groups:
        if isinstance(group.get("lr"), torch.Tensor):
            return "its learning rate is a tensor"
        for flag in ("amsgrad", "maximize", "differentiable", "fused"):
            if group.get(flag):
                return f"its optimizer sets {flag}"
    if precision != "float32" or half:
        return f"it computes in {precision} (compiled: float32)"
    if device.type != "cpu":
        return f"it runs on {device.type} (compiled: the CPU; a CUDA device replays the step as a CUDA graph)"
    if split:
        return "it runs the model again after optimizer.step()"
    return ""


class CompiledStep:
    """One program's training step compiled whole (see the module manual)."""

    def __init__(self, module: torch.nn.Module, named_params: Sequence[tuple[str, torch.nn.Parameter]],
                 optimizer: torch.optim.Optimizer, *, dynamic_scaling: bool, backend: str) -> None:
        self.module = module
        self.names = [n for n, _ in named_params]
        self.params = [p for _, p in named_params]
        trained = {id(p) for p in self.params}  # the rest are arguments too: an edit of a frozen weight is read
        fixed = [(n, p.detach()) for n, p in module.named_parameters() if id(p) not in trained]
        self.buffer_names = [n for n, _ in [*fixed, *module.named_buffers()]]
        self.buffers = [b for _, b in [*fixed, *module.named_buffers()]]
        self.optimizer = optimizer
        self.dynamic_scaling = dynamic_scaling
        self.backend = backend
        index = {id(p): i for i, p in enumerate(self.params)}
        self.groups = [[index[id(p)] for p in g["params"] if id(p) in index] for g in optimizer.param_groups]
        self.kind = type(optimizer)
        self._graphs: dict[tuple[Clip, Any, Any], Callable[..., Any]] = {}

    def _updates_so_far(self) -> int:
        """Updates the optimizer applied so far (Adam's ``step``), read from its state at each step: a
        loaded checkpoint or a state the script cleared starts it again."""
        for group in self.optimizer.param_groups:
            for p in group["params"]:
                step = self.optimizer.state.get(p, {}).get("step")
                if step is not None:
                    return int(step.item() if isinstance(step, torch.Tensor) else step)
        return 0

    def ready(self) -> bool:
        """Whether every weight has the state its update reads (a state the script cleared, or a
        checkpoint without it, is made again by one step op by op, as ``torch.optim`` makes it)."""
        keys = ("momentum_buffer",) if self.kind is torch.optim.SGD else ("exp_avg", "exp_avg_sq", "step")
        if self.kind is torch.optim.SGD and not any(g.get("momentum") for g in self.optimizer.param_groups):
            return True
        return all(all(k in self.optimizer.state.get(p, {}) for k in keys) for p in self.params)

    # -- the step as one function --------------------------------------------------------------

    def _slots(self) -> list[list[torch.Tensor]]:
        """Each weight's optimizer state tensors, in the order the update takes them."""
        out: list[list[torch.Tensor]] = []
        for p in self.params:
            st = self.optimizer.state.get(p, {})
            if self.kind is torch.optim.SGD:
                buf = st.get("momentum_buffer")
                out.append([buf] if buf is not None else [])
            else:
                out.append([st["exp_avg"], st["exp_avg_sq"], st["step"]])
        return out

    def _function(self, clip: Clip, split: Callable[[Any], tuple[torch.Tensor, dict[str, Any]]]) -> Callable[..., Any]:
        module, names, buffer_names = self.module, self.names, self.buffer_names
        groups, kind, dynamic = self.groups, self.kind, self.dynamic_scaling
        hyper = [dict(g) for g in self.optimizer.param_groups]

        def step(weights: list[torch.Tensor], buffers: list[torch.Tensor], slots: list[list[torch.Tensor]],
                 inputs: Any, rates: torch.Tensor, step_sizes: torch.Tensor, bias2_roots: torch.Tensor,
                 scale: torch.Tensor) -> tuple[Any, ...]:
            def scaled_loss(ws: list[torch.Tensor], bs: list[torch.Tensor]) -> tuple[torch.Tensor, Any]:
                loss, extra = split(torch.func.functional_call(
                    module, {**dict(zip(names, ws)), **dict(zip(buffer_names, bs))}, (inputs,)))
                loss = loss.float()
                return loss * scale, (loss.detach(), {k: v.detach() if isinstance(v, torch.Tensor) else v
                                                      for k, v in extra.items()})

            grads, (loss, extra) = torch.func.grad(scaled_loss, argnums=0, has_aux=True)(list(weights), list(buffers))
            grads = [g * (1.0 / scale) for g in grads]
            finite = torch.stack([torch.isfinite(g).all() for g in grads]).all()
            overflow = ~finite if dynamic else torch.zeros((), dtype=torch.bool)
            norm = None
            if clip.max_value:
                grads = [g.clamp(-clip.max_value, clip.max_value) for g in grads]
            if clip.max_norm:
                norms = torch.stack([torch.linalg.vector_norm(g, clip.norm_type) for g in grads])
                norm = torch.linalg.vector_norm(norms, clip.norm_type)
                coef = torch.clamp(clip.max_norm / (norm + 1e-6), max=1.0)
                grads = [g * coef for g in grads]
            keep = overflow  # a skipped update leaves every weight and state as it was
            for g_index, members in enumerate(groups):
                h, lr = hyper[g_index], rates[g_index]
                for i in members:
                    new = _update(kind, h, weights[i], grads[i], slots[i], lr, step_sizes[g_index],
                                  bias2_roots[g_index])
                    for target, value in zip([weights[i], *slots[i]], new):
                        target.copy_(torch.where(keep, target, value))
            return loss, extra, overflow, norm

        return step

    def run(self, inputs: Any, rates: Sequence[float], scale: float, clip: Clip,
            split: Callable[[Any], tuple[torch.Tensor, dict[str, Any]]]) -> StepResult:
        """One training step on ``inputs`` (on the device) with each group's learning rate and the
        loss scale; the first call of a clipping (and batch structure) builds its graph."""
        weights = [p.detach() for p in self.params]
        slots = self._slots()
        step_sizes, bias2_roots = self._bias_corrections(rates)
        args = (weights, self.buffers, slots, inputs, torch.tensor(list(rates), dtype=torch.float32),
                step_sizes, bias2_roots, torch.tensor(scale, dtype=torch.float32))
        key = (clip, _structure(inputs), self._hyperparameters())
        graph = self._graphs.get(key)
        if graph is None:
            graph = self._build(clip, split, args)
            self._graphs[key] = graph
        loss, extra, overflow, norm = graph(*args)
        return StepResult(loss=loss, extra=extra, overflow=overflow, grad_norm=norm)

    def _hyperparameters(self) -> tuple[Any, ...]:
        """The groups' hyperparameters a graph fixes (all but the params and the learning rate)."""
        return tuple(tuple(sorted((k, repr(v)) for k, v in g.items() if k not in ("params", "lr")))
                     for g in self.optimizer.param_groups)

    def _bias_corrections(self, rates: Sequence[float]) -> tuple[torch.Tensor, torch.Tensor]:
        """Adam's step size (lr / (1 - beta1^t)) and sqrt(1 - beta2^t) per group for this update,
        in double precision on the host as ``torch.optim`` computes them."""
        t = self._updates_so_far() + 1
        sizes, roots = [], []
        for group, lr in zip(self.optimizer.param_groups, rates):
            if self.kind is torch.optim.SGD:
                sizes.append(lr)
                roots.append(1.0)
                continue
            beta1, beta2 = group["betas"]
            sizes.append(lr / (1 - beta1 ** t))
            roots.append(math.sqrt(1 - beta2 ** t))
        return torch.tensor(sizes, dtype=torch.float32), torch.tensor(roots, dtype=torch.float32)

    def _build(self, clip: Clip, split: Callable[[Any], tuple[torch.Tensor, dict[str, Any]]],
               args: tuple[Any, ...]) -> Callable[..., Any]:
        """Trace the step into one graph (on copies: tracing runs it) and compile it."""
        def copies(x: Any) -> Any:
            return torch.utils._pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, x)
        traced = make_fx(self._function(clip, split))(*copies(args))
        log.info("compiling the whole training step (%s)", self.backend)
        return torch.compile(traced, backend=self.backend, fullgraph=True, dynamic=False)


def _structure(inputs: Any) -> Any:
    leaves, tree = torch.utils._pytree.tree_flatten(inputs)
    return tree, tuple((tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else repr(t) for t in leaves)


def _update(kind: type[torch.optim.Optimizer], h: dict[str, Any], w: torch.Tensor, g: torch.Tensor,
            slots: list[torch.Tensor], lr: torch.Tensor, step_size: torch.Tensor,
            bias2_root: torch.Tensor) -> list[torch.Tensor]:
    """One weight's new value and new state (in :meth:`CompiledStep._slots` order), by the
    formulas of ``torch.optim``'s per-tensor updates."""
    wd = float(h.get("weight_decay", 0.0) or 0.0)
    if kind is torch.optim.SGD:
        if wd:
            g = g + wd * w
        new_slots: list[torch.Tensor] = []
        momentum = float(h.get("momentum", 0.0) or 0.0)
        if momentum and slots:
            buf = slots[0] * momentum + (1 - float(h.get("dampening", 0.0) or 0.0)) * g
            new_slots.append(buf)
            g = g + momentum * buf if h.get("nesterov") else buf
        return [w - lr * g, *new_slots]
    exp_avg, exp_avg_sq, step = slots
    beta1, beta2 = h["betas"]
    if kind is torch.optim.AdamW:
        w = w * (1 - lr * wd)
    elif wd:
        g = g + wd * w
    exp_avg = exp_avg + (g - exp_avg) * (1 - beta1)
    exp_avg_sq = exp_avg_sq * beta2 + (g * g) * (1 - beta2)
    denom = exp_avg_sq.sqrt() / bias2_root + float(h["eps"])
    return [w - step_size * (exp_avg / denom), exp_avg, exp_avg_sq, step + 1]
