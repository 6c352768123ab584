"""The engine: executes a captured program with weights, optimizer and scaler state resident.

One :class:`Engine` holds one program (a ``torch.export`` ExportedProgram of forward+loss) and
its :class:`~csrun.program.spec.ProgramSpec`. A training step runs the captured graph (not the
user's Python: side effects in the step happened once, at capture), backward through autograd,
unscale/overflow check, clipping, the optimizer update with the learning rate the schedule gives
for the global step (torch's update arithmetic, without ``torch.optim``'s per-step wrappers where
:mod:`~csrun.emulator.engine.lean_step` applies: for one-group SGD with a static loss scale and no
clipping, everything after the backward is one TorchScript call that runs without the GIL), and
the loss-scale update. All state lives on the engine's device. On a CUDA device a step's
forward and backward replay as a CUDA graph where the step allows it
(:mod:`~csrun.emulator.engine.cuda_graph` says which steps).

The program's forward returns the loss, or a tuple/list whose first item is the loss, or a
mapping with a ``"loss"`` key; other items come back as extra outputs (``output_<i>`` for
sequence items, their keys for mappings).
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import Any, Callable

import torch
from torch.utils import _pytree as pytree

from csrun.emulator.engine import compiled_step, cuda_graph, half_emulation, loss_scaling, precision, traced_forward, \
    update_split
from csrun.program.errors import SpecError
from csrun.emulator.engine.lean_step import ScriptedUpdate, lean_step, scripted_update
from csrun.program.step_plan import FULL_STEP, StepPlan
from csrun.program import clipping, schedules
from csrun.program import optimizer_classes as optimizers
from csrun.program.spec import ProgramSpec

log = logging.getLogger("csrun.emulator")

STATE_FORMAT = 1

GRADIENT_PREFIX = "grad:"
"""The outputs of a step whose plan asks for its gradients (:attr:`StepPlan.report_gradients`):
``grad:<weight name>``, the gradient the update applied (unscaled and clipped)."""
"""Version of the :meth:`Engine.state_dict` layout."""


def parse_device(device: str | torch.device) -> torch.device:
    """Validate ``cpu``, ``cuda`` or ``cuda:i`` and check the device exists."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise SpecError(f"device: {device!r} is not a device; use cpu, cuda or cuda:<index>") from None
    if dev.type == "cpu":
        return torch.device("cpu")
    if dev.type != "cuda":
        raise SpecError(f"device: {device!r} is not supported; use cpu, cuda or cuda:<index>")
    if not torch.cuda.is_available():
        raise SpecError(f"device: {device!r} asked for, but no CUDA device is visible here")
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    if index >= torch.cuda.device_count():
        raise SpecError(f"device: {device!r} does not exist; {torch.cuda.device_count()} CUDA device(s) visible")
    return torch.device("cuda", index)


def _split_outputs(out: Any) -> tuple[torch.Tensor, dict[str, Any]]:
    """Separate the loss from extra outputs."""
    if isinstance(out, torch.Tensor):
        return out, {}
    if isinstance(out, dict):
        if "loss" not in out:
            raise SpecError(f"program outputs a mapping without a 'loss' key (keys: {sorted(out)})")
        return out["loss"], {str(k): v for k, v in out.items() if k != "loss"}
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0], {f"output_{i}": v for i, v in enumerate(out) if i > 0}
    raise SpecError(f"program output must be the loss, (loss, ...) or {{'loss': ...}}; got {type(out).__name__}")


def _move_constants(module: torch.fx.GraphModule, device: torch.device) -> None:
    """Copy lifted tensor constants to ``device``: the unlifted module keeps them as plain
    attributes, which ``Module.to`` does not touch, and shares them with the script's (a tensor
    attribute the script edits in place must not change the program under the engine's thread)."""
    for node in module.graph.nodes:
        if node.op != "get_attr":
            continue
        owner: Any = module
        *path, leaf = str(node.target).split(".")
        for part in path:
            owner = getattr(owner, part)
        value = getattr(owner, leaf, None)
        if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter) \
                and leaf not in getattr(owner, "_buffers", {}):
            setattr(owner, leaf, value.detach().to(device, copy=True))


_NO_CHANGE = contextlib.nullcontext()
"""The forward of a step with a backward runs in the caller's grad mode (on)."""


def _backward(root: torch.Tensor, unit: torch.Tensor) -> None:
    """``root.backward()`` that needs no GIL until it is done, whatever the training loop does meanwhile.

    The embedded engine shares the chief's GIL with the training loop, which runs Python beside
    the backward (a closure, the next step's recording). Two things in a plain ``backward()``
    wait for that Python to let go of the GIL:

    - it frees each saved tensor as soon as it is used, and freeing one that was ever a Python
      object takes the GIL (torch keeps such a tensor's Python object alive for it): the backward
      stalls about as long as the loop's Python runs (BENCHMARKS.md). ``retain_graph=True`` keeps them; the caller
      drops the graph right after, on this thread, which holds the GIL then (and before the
      update, so the update's memory peak is what it was);
    - ``torch.autograd.backward`` makes the initial gradient with a torch op before it enters the
      C++ engine, and a torch op lets the GIL go: the loop, just handed the step's outputs, takes
      it there. A scalar float32 loss (the engine's, always) gets ``unit`` instead, and the C++
      engine is entered at once (``_engine_run_backward``, what ``torch.autograd.backward`` calls).

    The gradients are those of ``root.backward()``. Anything else (a loss that is not a scalar,
    a torch without that entry point) goes through ``root.backward(retain_graph=True)``.
    """
    run = getattr(torch.autograd.graph, "_engine_run_backward", None)
    if run is None or root.ndim != 0 or root.dtype != unit.dtype or root.device != unit.device:
        root.backward(retain_graph=True)
        return
    run((root,), (unit,), True, False, (), allow_unreachable=True, accumulate_grad=True)


def drop_metadata_asserts(module: torch.fx.GraphModule) -> int:
    """Remove ``aten._assert_tensor_metadata`` checks from the graph; how many were removed.

    torch.export records a ``.float()`` / ``.to(dtype)`` in the forward as an assertion that
    its input has the dtype and device seen at capture. The device runs the graph under
    autocast (float16 / bfloat16) and on other devices (cuda), where those facts no longer
    hold although the graph is right, so the assertions are dropped; the casts stay.
    """
    target = torch.ops.aten._assert_tensor_metadata.default
    removed = 0
    for node in list(module.graph.nodes):
        if node.op == "call_function" and node.target is target and not node.users:
            module.graph.erase_node(node)
            removed += 1
    if removed:
        module.recompile()
    return removed


def retarget_graph(module: torch.fx.GraphModule, device: torch.device) -> int:
    """Make a graph captured on the CPU run on ``device``; how many nodes were changed.

    Two facts of the capture are burnt into the graph, and both hold only on the CPU:

    - tensors the forward creates (``torch.arange(n, device=x.device)``, ``torch.zeros``, a
      ``.to(x.device)``) name the CPU: they are made on ``device`` instead; a region under the
      script's ``torch.autocast("cpu", ...)`` autocasts on ``device``;
    - ``x.view(shape)`` is recorded as ``aten.view`` on the strides the capture saw. Another
      device's kernels may lay their outputs out differently (CUDA's attention does), and a view
      of such an output fails ("view size is not compatible with input tensor's size and
      stride") although the program is right. ``aten.reshape`` is that same view wherever a view
      is possible and a copy only where it is not, so the graph computes the same values.

    Nested graphs (higher-order ops) are rewritten too.
    """
    views = (torch.ops.aten.view.default, torch.ops.aten._unsafe_view.default)
    changed = 0
    for graph_module in module.modules():
        if not isinstance(graph_module, torch.fx.GraphModule):
            continue
        here = 0
        for node in graph_module.graph.nodes:
            if node.op != "call_function":
                continue
            if node.target in views:
                node.target = torch.ops.aten.reshape.default
                here += 1
            if _on_cpu(node.kwargs.get("device")):
                node.kwargs = {**node.kwargs, "device": device}
                here += 1
            if node.target is torch.ops.aten.to.device and len(node.args) > 1 and _on_cpu(node.args[1]):
                node.args = (node.args[0], device, *node.args[2:])
                here += 1
            if node.target is _AUTOCAST and node.args and node.args[0] == "cpu":  # the script's torch.autocast
                node.args = (device.type, *node.args[1:])
                here += 1
        if here:
            graph_module.recompile()
            changed += here
    return changed


_AUTOCAST = getattr(torch.ops.higher_order, "wrap_with_autocast", None)
"""The higher-order op torch.export records a ``torch.autocast`` block as."""


def _on_cpu(value: Any) -> bool:
    """Whether a node's device argument names the CPU."""
    return isinstance(value, (torch.device, str)) and torch.device(value).type == "cpu"


def drop_input_guards(module: torch.fx.GraphModule) -> bool:
    """Stop the unlifted module checking its inputs on every call (the engine checks each batch
    against the spec's input schema instead); True when there was a guard call to remove.

    ``ExportedProgram.module()`` re-checks every call's inputs twice: a forward pre-hook that
    matches their pytree structure and constraints, and a generated ``_guards_fn`` called from
    the graph. On a small model they are a noticeable part of a step.
    """
    removed = False
    for node in list(module.graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn" and not node.users:
            module.graph.erase_node(node)
            removed = True
    if removed:
        module.recompile()
    if "_guards_fn" in module._modules:
        del module._modules["_guards_fn"]
    setattr(module, "validate_inputs", False)  # the pre-hook returns at once
    return removed


class Engine:
    """Executes one program on one device; see the module docstring for the step's phases."""

    def __init__(
        self,
        program: torch.export.ExportedProgram,
        spec: ProgramSpec,
        device: str | torch.device = "cpu",
        *,
        notice: Callable[[str], None] | None = None,
        step_graph: bool | None = None,
    ) -> None:
        """Place the program's weights on ``device`` and build optimizer, schedule and scaler.

        ``step_graph``: run the steps through a :class:`~csrun.emulator.engine.cuda_graph.StepGraph`
        (None: on a CUDA device unless ``CSRUN_CUDA_GRAPH=off``; True on a CPU: its body without a
        graph, as the tests compare it). Raises :class:`SpecError` for spec values the emulator cannot run.
        """
        self.notice = notice or (lambda msg: log.warning("%s", msg))
        self.device = parse_device(device)
        self.spec = spec
        if spec.mode not in ("train", "eval"):
            raise SpecError(f"mode: {spec.mode!r} is not a program mode; valid: train, eval")
        self.training = spec.mode == "train"
        self.precision = precision.resolve_precision(spec.precision, self.notice)
        module = program.module()
        drop_metadata_asserts(module)
        if self.device.type != "cpu":  # the capture's devices and strides are the CPU's
            retarget_graph(module, self.device)
        self._inputs = tuple(spec.inputs)
        self._tree: Any = None  # the last batch structure checked against the inputs' paths
        if self._inputs:  # each batch is checked against them in _to_device
            drop_input_guards(module)
        if self.precision == "cbfloat16":
            precision.apply_cbfloat16(module)
        self.half_weights = self._emulate_half(module)
        with torch.no_grad():
            # own copies, before the move: the unlifted module shares its parameters with the
            # program's state dict (in the embedded device, the user's model's), and neither
            # training nor Module.to (which swaps a parameter's .data in place) may change them
            fresh: dict[int, torch.nn.Parameter] = {}  # tied weights stay tied
            fresh_buffers: dict[int, torch.Tensor] = {}
            for mod in module.modules():
                for name, p in list(mod._parameters.items()):
                    if p is not None:
                        if id(p) not in fresh:
                            data = p.detach().float() if p.is_floating_point() else p.detach()
                            fresh[id(p)] = torch.nn.Parameter(data.clone(), requires_grad=p.requires_grad)
                        mod._parameters[name] = fresh[id(p)]
                for name, b in list(mod._buffers.items()):
                    if b is not None:
                        if id(b) not in fresh_buffers:
                            fresh_buffers[id(b)] = b.clone()
                        mod._buffers[name] = fresh_buffers[id(b)]
        module.to(self.device)
        _move_constants(module, self.device)
        self.module = module
        if self.half_weights is not None:
            self.half_weights.bind()  # the leaves follow the fresh weights
        self._split = update_split.split_at_update(module) if self.training else None
        """The program cut at its update, when the step ran the model again after it (made after
        every attribute of the module is final: its parts read the module's weights and leaves)."""
        # the precision the forward's kernels run in: float32 when the graph rounds 16-bit values itself
        self._kernel_precision = "float32" if self.half_weights is not None else self.precision
        self._forward: Callable[[Any], Any] | None = None  # chosen at the first step (_forward_for)
        self._trace = (traced_forward.trace_mode() == "auto" and self.device.type == "cpu" and self._split is None
                       and precision.autocast_dtype(self._kernel_precision) is None)
        self.named_params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.params = [p for _, p in self.named_params]
        self.global_step = torch.zeros((), dtype=torch.int64, device=self.device)
        self._unit = torch.ones((), dtype=torch.float32, device=self.device)
        """The backward's initial gradient for a scalar float32 loss (see :func:`_backward`)."""
        self._step = 0  # host mirror of global_step: no device read per step
        self._holding_grads = False  # gradients kept from a step without an update (accumulation)
        self._grad_held: set[int] = set()
        """Indices into :attr:`params` of the weights whose ``.grad`` eager PyTorch holds (a tensor, not
        None) after the last backward (:meth:`_track_gradients`)."""
        self.optimizer: torch.optim.Optimizer | None = None
        self._lean_step: Callable[[], bool] | None = None  # the update without torch.optim's wrappers
        self._scripted_update: ScriptedUpdate | None = None  # all of it in one TorchScript call (one-group SGD)
        self.schedule: schedules.Schedule | None = None
        """Group 0's learning-rate schedule (every group's unless :attr:`group_schedules`)."""
        self.group_schedules: list[schedules.Schedule] | None = None
        """One schedule per param group, when the groups' learning rates differ."""
        self.scaler: loss_scaling.LossScaler | None = None
        self.max_norm = spec.max_gradient_norm
        self.max_value = spec.max_gradient_value
        if self.training:
            opt_spec = spec.optimizer
            if opt_spec is None:
                raise SpecError("a train program needs an optimizer in its spec")
            self.schedule = schedules.build_schedule(spec.learning_rate)
            clipping.check_clipping(self.max_norm, self.max_value)
            ls = spec.loss_scaling
            self.scaler = loss_scaling.LossScaler(
                factor=ls.factor, initial_loss_scale=ls.initial_loss_scale,
                steps_per_increase=ls.steps_per_increase, min_loss_scale=ls.min_loss_scale,
                max_loss_scale=ls.max_loss_scale,
            )
            groups = tuple(opt_spec.param_groups)
            self.group_schedules = [schedules.build_schedule(g.get("learning_rate", spec.learning_rate))
                                    for g in groups] if any("learning_rate" in g for g in groups) else None
            self.optimizer = optimizers.build_optimizer(
                opt_spec.type, dict(opt_spec.hyperparameters), self.named_params, lr=self._rates(0),
                param_groups=groups, weight_names=[n for n, _ in module.named_parameters()])
            optimizers.preinitialize_state(self.optimizer)
            self._lean_step = lean_step(self.optimizer)
            self._scripted_update = scripted_update(self.optimizer, self.params, self.half_weights)
        self._graph_scale = torch.ones((), dtype=torch.float32, device=self.device)
        """The loss scale as the graph reads it (set before a step when the scaler's changed)."""
        self._graph_scale_value = 1.0
        self.step_graph = self._make_step_graph(step_graph)
        self._compiled_mode = compiled_step.compiled_mode() if self.training else "off"
        self._compiled: compiled_step.CompiledStep | None = None
        """The whole step compiled (:mod:`~csrun.emulator.engine.compiled_step`), built at its first use."""
        # train/eval behaviour (dropout, batch norm) is fixed in the captured graph; the
        # unlifted module refuses .train()/.eval(), so nothing is switched here.

    def _make_step_graph(self, wanted: bool | None) -> cuda_graph.StepGraph | None:
        """The steps' graph, or None (no CUDA device, switched off, or a program it cannot hold: one notice)."""
        if wanted is False or (wanted is None and (self.device.type != "cuda" or cuda_graph.graph_mode() == "off")):
            return None
        if self._split is not None:
            cuda_graph.say_without_graph(self.notice, "it runs the model again after optimizer.step(), on the "
                                                      "updated weights")
            return None
        return cuda_graph.StepGraph(self._graph_body, self.device, self.notice, reset=self._clear_gradients)

    def _grad_holders(self) -> list[torch.Tensor]:
        """The tensors the backward leaves gradients on: the trainable weights, and with 16-bit
        emulation the leaves their rounded copies are read through."""
        leaves = self.half_weights.leaves if self.half_weights is not None else []
        return [*self.params, *leaves]

    def _graph_body(self, inputs: Any) -> tuple[dict[str, Any], list[torch.Tensor | None]]:
        """What a step's graph holds (:mod:`~csrun.emulator.engine.cuda_graph`): the forward and, in
        training, the loss scaling (by the scale as a float32 tensor) and the backward — the values
        :meth:`run_step` computes for them without a graph. Returns the outputs and the gradients
        of :meth:`_grad_holders`."""
        with self._forward_context(), _NO_CHANGE if self.training else torch.no_grad():
            loss, extra = _split_outputs(self._forward_for(inputs)(inputs))
        loss = loss.float()
        out = {"loss": loss.detach(), **{k: v.detach() if isinstance(v, torch.Tensor) else v for k, v in extra.items()}}
        del extra
        if not self.training:
            return out, []
        root = loss * self._graph_scale  # always: a scale of 1 multiplies exactly, and may change later
        _backward(root, self._unit)
        del loss, root
        return out, [t.grad for t in self._grad_holders()]

    def _graphed_step(self, batch: Any, plan: StepPlan,
                      publish: Callable[[dict[str, Any]], None] | None) -> dict[str, torch.Tensor]:
        """:meth:`run_step` through the step's graph: its body replayed, then the update as without it."""
        graph = self.step_graph
        assert graph is not None  # noqa: S101 - run_step's choice
        leaves, tree = self._checked_leaves(batch)
        if not self.training:
            return graph.run(leaves, tree)[0]
        assert self.scaler is not None  # noqa: S101 - a train engine has one
        rates, scale = self._rates(self._step, plan), self.scaler.scale
        if self._graph_scale_value != scale:
            self._graph_scale.fill_(scale)
            self._graph_scale_value = scale
        values, grads = graph.run(leaves, tree)
        for holder, grad in zip(self._grad_holders(), grads):
            holder.grad = grad
        out = {"loss": values.pop("loss"), **self._step_values(rates, scale, plan), **values}
        if publish is not None and self._clipping(plan)[0] is None and not plan.report_gradients:
            publish(out)  # the graph's outputs are copies: the update cannot change them
        self._update(out, plan, rates)
        return out

    def _step_values(self, rates: float | list[float], scale: float, plan: StepPlan) -> dict[str, torch.Tensor]:
        """A training step's ``lr`` and ``loss_scale`` (the values it used) and ``global_step`` (after it)."""
        return {
            "lr": torch.full((), rates[0] if isinstance(rates, list) else rates, dtype=torch.float32,
                             device=self.device),
            "loss_scale": torch.full((), scale, dtype=torch.float32, device=self.device),
            "global_step": self.global_step + 1 if plan.update else self.global_step.clone(),
        }

    def _rates(self, step: int, plan: StepPlan = FULL_STEP) -> float | list[float]:
        """The learning rate of ``step``: one for every group, or one per group; a group whose
        ``lr`` the plan gives (:attr:`StepPlan.hyperparameters`: set on the host) takes that."""
        if self.group_schedules is not None:
            rates: float | list[float] = [float(schedule(step)) for schedule in self.group_schedules]
        else:
            assert self.schedule is not None  # noqa: S101 - a train engine has one
            rates = self.schedule(step)
        given = [(g, v) for g, k, v in plan.hyperparameters if k == "lr"]
        if not given or self.optimizer is None:
            return rates
        groups = len(self.optimizer.param_groups)
        per_group = list(rates) if isinstance(rates, list) else [rates] * groups
        for group, value in given:
            if group >= groups or isinstance(value, (bool, tuple)):
                raise SpecError(f"step plan: lr {value!r} for param group {group}; the optimizer has {groups}")
            per_group[group] = float(value)
        return per_group

    def _set_hyperparameters(self, plan: StepPlan) -> None:
        """The plan's hyperparameters other than ``lr`` into the optimizer's groups (they stay there,
        as the script's change stays in its param group)."""
        opt = self.optimizer
        assert opt is not None  # noqa: S101 - a train engine has one
        for group, key, value in plan.hyperparameters:
            if key == "lr":
                continue
            if group >= len(opt.param_groups) or key not in opt.param_groups[group] or key == "params":
                raise SpecError(f"step plan: the optimizer's param group {group} has no hyperparameter {key!r}")
            optimizers.set_hyperparameter(opt.param_groups[group], key, value)

    def _emulate_half(self, module: torch.fx.GraphModule) -> half_emulation.HalfWeights | None:
        """For float16 / bfloat16 in ``rounding`` mode, rewrite ``module`` to compute on float32
        kernels (:mod:`csrun.emulator.engine.half_emulation`) and return its weights' 16-bit copies; None
        when it runs under autocast. A graph the dtype probe cannot run keeps autocast, with a notice."""
        dtype = precision.autocast_dtype(self.precision)
        if dtype is None or half_emulation.half_emulation_mode(self.device) != "rounding":
            return None
        try:
            dtypes = half_emulation.autocast_dtypes(module, dtype, self.device.type)
        except Exception as exc:  # noqa: BLE001 - any probe failure: keep the 16-bit kernels
            self.notice(f"{self.precision} emulation by rounding is not possible for this program "
                        f"({type(exc).__name__}: {exc}); running it under autocast")
            return None
        return half_emulation.apply_half_emulation(module, dtype, dtypes)

    def _forward_for(self, inputs: Any) -> Callable[[Any], Any]:
        """The forward to run: a checked trace of the graph on a CPU without autocast
        (:mod:`csrun.emulator.engine.traced_forward`), else the graph; chosen at the first step."""
        if self._forward is None:
            traced = traced_forward.TracedForward.build(self.module, inputs) if self._trace else None
            self._forward = traced if traced is not None else self.module
        return self._forward

    def _forward_context(self) -> Any:
        """autocast for 16-bit compute on 16-bit kernels; nothing when the graph rounds itself. With a
        step graph autocast casts a weight at each read, graphed step or not (a capture asks for
        it): a weight two 16-bit ops read then sums its two gradients in float32, where autocast's
        cache would sum them in 16 bits (:func:`~csrun.emulator.engine.precision.forward_context`)."""
        if self.half_weights is not None:
            self.half_weights.refresh()
        return precision.forward_context(self._kernel_precision, self.device, cache=self.step_graph is None)

    @property
    def step(self) -> int:
        """The global step: number of training steps run (skipped updates included)."""
        return self._step

    def _to_device(self, batch: Any) -> Any:
        """The batch checked against the program's inputs (:meth:`_checked_leaves`), on the device."""
        leaves, tree = self._checked_leaves(batch)
        return pytree.tree_unflatten([t.to(self.device, non_blocking=True) if isinstance(t, torch.Tensor) else t
                                      for t in leaves], tree)

    def _checked_leaves(self, batch: Any) -> tuple[list[Any], Any]:
        """The batch's leaves and structure, checked against the program's inputs (structure,
        static shapes) and cast to the captured dtypes; where they were."""
        leaves, tree = pytree.tree_flatten(batch)
        specs = self._inputs
        if specs and tree != self._tree:
            self._check_structure(batch)
            self._tree = tree
        out = []
        for i, leaf in enumerate(leaves):
            if not isinstance(leaf, torch.Tensor):
                out.append(leaf)
                continue
            if specs:
                ts = specs[i]
                if tuple(leaf.shape) != tuple(ts.shape):
                    raise SpecError(
                        f"input {ts.path}: shape {tuple(leaf.shape)} but the program was captured with "
                        f"{tuple(ts.shape)} (sizes must be static)"
                    )
                want = getattr(torch, ts.dtype, None)
                if isinstance(want, torch.dtype) and leaf.dtype != want:
                    leaf = leaf.to(want)  # e.g. int32 on the wire -> int64 as captured
            out.append(leaf)
        return out, tree

    def _check_structure(self, batch: Any) -> None:
        """The batch's leaves must be the captured ones, by path (a dict's keys, a tuple's length)."""
        paths = [pytree.keystr(p) or "<batch>" for p, _ in pytree.tree_flatten_with_path(batch)[0]]
        want = [ts.path for ts in self._inputs]
        if paths != want:
            raise SpecError(f"the batch's structure {paths} is not the captured one {want}")

    def run_step(self, batch: Any, publish: Callable[[dict[str, Any]], None] | None = None,
                 plan: StepPlan = FULL_STEP) -> dict[str, torch.Tensor]:
        """Run one step on ``batch``; returns device tensors: ``loss``, and for training ``lr`` and
        ``loss_scale`` (the values this step used) and ``global_step`` (after it), plus the
        program's extra outputs.

        ``plan`` says what the script's step did after the forward (:class:`StepPlan`): a step
        without ``backward`` runs the forward alone; one without ``update`` keeps its gradients
        for a later update (accumulation) and leaves the global step where it is; its clipping
        is this update's. A program the step ran the model in again after the update
        (:mod:`~csrun.emulator.engine.update_split`) computes those outputs after the update.

        Every output is known once the forward has run, so a training step hands them to
        ``publish`` then (extra outputs copied), before the backward pass and the update: whoever
        waits for the values need not wait for the update too (unless an output comes after the
        update: the gradient norm of clipping, or values of the program's second part).
        """
        if self.step_graph is not None and (not self.training or (plan.backward and not self._holding_grads)):
            return self._graphed_step(batch, plan, publish)
        if self._compiled_mode != "off" and self._compiles(plan):
            return self._compiled_run(batch, plan, publish)
        inputs = self._to_device(batch)
        if not self.training:
            with torch.no_grad(), self._forward_context():
                loss, extra = _split_outputs(self._forward_for(inputs)(inputs))
            return {"loss": loss.detach().float(), **{k: v.detach() if isinstance(v, torch.Tensor) else v
                                                      for k, v in extra.items()}}
        scaler = self.scaler
        if self.optimizer is None or self.schedule is None or scaler is None:
            raise RuntimeError("train engine without optimizer, schedule or scaler")
        rates = self._rates(self._step, plan)
        scale = scaler.scale
        carried: list[Any] = []
        with self._forward_context(), _NO_CHANGE if plan.backward else torch.no_grad():
            if self._split is None:
                loss, extra = _split_outputs(self._forward_for(inputs)(inputs))
            else:
                first, carried = self._split.run_before(inputs)
                loss, extra = _split_outputs(first)
        loss = loss.float()
        out: dict[str, Any] = {"loss": loss.detach(), **self._step_values(rates, scale, plan)}
        copied = publish is not None or (plan.backward and plan.update)  # an extra may alias a weight the update changes
        for k, v in extra.items():
            out[k] = (v.detach().clone() if copied else v.detach()) if isinstance(v, torch.Tensor) else v
        del extra
        if plan.backward:
            if publish is not None and self._split is None and self._clipping(plan)[0] is None \
                    and not plan.report_gradients:
                publish(out)  # else an output comes after the update: the gradient norm, the gradients, the second part
            if plan.clear_grads and self._holding_grads:
                self._clear_gradients()
            root = loss * scale if scale != 1.0 else loss
            _backward(root, self._unit)
            del loss, root  # the step's graph: its last references (see _backward)
            self._update(out, plan, rates)
        if self._split is not None:
            with self._forward_context():
                out.update(self._split.run_after(inputs, carried))
        return out

    def _compiles(self, plan: StepPlan) -> bool:
        """Whether this step runs as the compiled whole step: a whole step (backward, update,
        gradients cleared; none reported) after one on today's path in which every trainable
        weight got a gradient; the program's first such step builds it, or says once why it
        cannot and runs op by op from then on."""
        if not (plan.backward and plan.update and plan.clear_grads and not plan.report_gradients
                and not self._holding_grads and self.params
                and len(self._grad_held) == len(self.params)):
            return False
        if self._compiled is None:
            assert self.optimizer is not None and self.scaler is not None  # noqa: S101 - a train engine has them
            reason = compiled_step.why_not(self.optimizer, precision=self.precision, device=self.device,
                                           half=self.half_weights is not None, split=self._split is not None)
            if reason:
                self.notice(f"CSRUN_COMPILED_STEP={self._compiled_mode}: the step is not compiled whole because "
                            f"{reason}; it runs op by op")
                self._compiled_mode = "off"
                return False
            self._compiled = compiled_step.CompiledStep(
                self.module, self.named_params, self.optimizer, dynamic_scaling=self.scaler.dynamic,
                backend=compiled_step.backend_of(self._compiled_mode))
        return self._compiled.ready()

    def _compiled_run(self, batch: Any, plan: StepPlan,
                      publish: Callable[[dict[str, Any]], None] | None) -> dict[str, torch.Tensor]:
        """:meth:`run_step` as one compiled graph: the same outputs, state and loss-scale bookkeeping."""
        compiled, scaler, opt = self._compiled, self.scaler, self.optimizer
        assert compiled is not None and scaler is not None and opt is not None  # noqa: S101 - _compiles built it
        inputs = self._to_device(batch)
        if plan.hyperparameters:
            self._set_hyperparameters(plan)  # another value than the graph's builds another graph
        rates = self._rates(self._step, plan)
        per_group = list(rates) if isinstance(rates, list) else [rates] * len(opt.param_groups)
        optimizers.set_learning_rate(opt, rates)  # the groups show this update's rate, as on today's path
        clip_norm, clip_value, norm_type = self._clipping(plan)
        scale = scaler.scale
        result = compiled.run(inputs, per_group, scale, compiled_step.Clip(clip_norm, clip_value, norm_type),
                              _split_outputs)
        overflow = bool(result.overflow) if scaler.dynamic else False
        out: dict[str, Any] = {"loss": result.loss, **self._step_values(rates, scale, plan), **result.extra}
        if clip_norm:
            out["grad_norm"] = result.grad_norm
        scaler.update(overflow)
        self._advance()
        if publish is not None:
            publish(out)
        return out

    def _update(self, out: dict[str, Any], plan: StepPlan, rates: float | list[float], *, scripted: bool = True) -> None:
        """After the backward: keep the gradients (no update in ``plan``: accumulation), or unscale,
        clip, update and clear them, and update the loss scale; the gradient norm goes to ``out``
        (and, when the plan asks, the gradients the update applied: ``grad:<weight>``).
        ``scripted=False``: not by the scripted update (the gradients are the masters' own)."""
        opt, scaler = self.optimizer, self.scaler
        assert opt is not None and scaler is not None  # noqa: S101 - a train engine has them
        if plan.hyperparameters:
            self._set_hyperparameters(plan)
        if not plan.update:
            if self.half_weights is not None:
                self.half_weights.gradients_to_masters()
            self._track_gradients(plan)
            self._holding_grads = True
            return
        clip_norm, clip_value, norm_type = self._clipping(plan)
        if scripted and self._scripted_update is not None and not scaler.dynamic and clip_norm is None \
                and clip_value is None and not plan.report_gradients and not self._zeros_due(plan):
            optimizers.set_learning_rate(opt, rates)
            if self._scripted_update(1.0 / scaler.scale):  # rounding, unscaling, update: no overflow to check
                self._grad_held = set(range(len(self.params)))  # it ran only with every weight's gradient
                self._holding_grads = False
                self._advance()
                return
        if self.half_weights is not None:
            self.half_weights.gradients_to_masters()
        self._track_gradients(plan)
        grads = [p.grad for p in self.params if p.grad is not None]
        overflow = scaler.unscale_and_check(grads)
        total: torch.Tensor | None = None
        if not overflow:
            total = clipping.clip_gradients(grads, max_norm=clip_norm, max_value=clip_value, norm_type=norm_type)
        elif clip_norm and grads:
            total = clipping.gradient_norm(grads, norm_type)  # not finite: the update is skipped
        if clip_norm:
            out["grad_norm"] = total if total is not None else torch.zeros((), device=self.device)
        if not overflow:
            if plan.report_gradients:
                out.update({f"{GRADIENT_PREFIX}{name}": p.grad.detach().clone()
                            for name, p in self.named_params if p.grad is not None})
            optimizers.set_learning_rate(opt, rates)
            if self._lean_step is None or not self._lean_step():
                opt.step()
        self._clear_gradients()
        scaler.update(overflow)
        self._advance()

    def _zeros_due(self, plan: StepPlan) -> bool:
        """Whether a weight this step's backward did not reach may still hold a zero gradient in
        eager PyTorch (a ``zero_grad(set_to_none=False)`` kept it): :meth:`_track_gradients` gives it one."""
        return bool(self._grad_held) and not (plan.clear_grads and plan.grads_to_none)

    def _track_gradients(self, plan: StepPlan) -> None:
        """Follow which weights hold a gradient in eager PyTorch: those this step's backward reached,
        and, after a ``zero_grad(set_to_none=False)``, every one that held one before (now zero);
        give the latter a zero gradient on the device, so the update treats them as eager's does."""
        if plan.clear_grads and plan.grads_to_none:
            self._grad_held = set()
        reached = {i for i, p in enumerate(self.params) if p.grad is not None}
        for i in self._grad_held - reached:
            self.params[i].grad = torch.zeros_like(self.params[i])
        self._grad_held |= reached

    # the data-parallel halves of a step (csrun.emulator.swarm): a system's forward and backward,
    # MemoryX's update of the summed gradients -----------------------------------------------

    def flat_weights(self) -> torch.Tensor:
        """The trainable weights, flattened into one float32 vector (in :attr:`params` order)."""
        return torch.cat([p.detach().reshape(-1) for p in self.params]) if self.params else torch.zeros(0)

    def load_flat_weights(self, flat: torch.Tensor) -> None:
        """Set the trainable weights from :meth:`flat_weights`' layout."""
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                p.copy_(flat[offset:offset + n].view_as(p))
                offset += n

    def flat_gradients(self) -> torch.Tensor:
        """The gradients the device holds (zeros for a weight without one), flattened like the weights."""
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params]) \
            if self.params else torch.zeros(0)

    def gradient_mask(self) -> torch.Tensor:
        """1.0 for each trainable weight that holds a gradient, 0.0 for one that has none (float32, in
        :attr:`params` order): a weight no loss reached keeps ``grad`` None, which optimizers skip."""
        return torch.tensor([float(p.grad is not None) for p in self.params], dtype=torch.float32)

    def clear_gradients(self) -> None:
        """Drop the gradients the device holds."""
        self._clear_gradients()

    def set_loss_scale(self, scale: float) -> None:
        """Compute the next backward at this loss scale (a system follows MemoryX's scaler)."""
        if self.scaler is None:
            raise RuntimeError("an eval engine has no loss scale")
        self.scaler.state.scale = float(scale)

    def apply_gradients(self, flat: torch.Tensor, plan: StepPlan = FULL_STEP,
                        present: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Take ``flat`` (:meth:`flat_weights`' layout) as this step's loss-scaled gradients and run
        the update as :meth:`run_step` does after its backward: unscale and overflow check (an
        overflow skips the update and moves the scale once), clipping, the optimizer with the
        schedule's rate for the global step, the loss-scale update. ``present`` (:meth:`gradient_mask`'s
        layout): weights marked 0 get no gradient (None), as in a step that did not reach them.
        Returns ``lr``, ``loss_scale`` (the values this step used), ``global_step`` (after it) and,
        with clipping, ``grad_norm``. The weights' gradients are views of ``flat`` where its device and
        dtype are theirs (the update unscales them in place), dropped by the update."""
        if self.scaler is None or self.optimizer is None:
            raise RuntimeError("an eval engine has no update")
        rates = self._rates(self._step, plan)
        offset = 0
        for i, p in enumerate(self.params):
            n = p.numel()
            reached = present is None or bool(present[i] > 0)
            grad = flat[offset:offset + n].view_as(p)  # a view where it can be: MemoryX holds no second copy
            p.grad = (grad if grad.device == p.device and grad.dtype == p.dtype else grad.to(p)) if reached else None
            offset += n
        out: dict[str, Any] = self._step_values(rates, self.scaler.scale, FULL_STEP)
        self._update(out, plan, rates, scripted=self.half_weights is None)  # the scripted update reads 16-bit leaves
        return out

    def _advance(self) -> None:
        """One more update: the global step."""
        self._step += 1
        self.global_step.add_(1)

    def _clipping(self, plan: StepPlan) -> tuple[float | None, float | None, float]:
        """This update's clipping: the step's own (``clip_grad_norm_`` / ``clip_grad_value_`` in the
        loop), else the program's; (max norm, max value, norm type)."""
        if plan.max_gradient_norm is not None or plan.max_gradient_value is not None:
            return plan.max_gradient_norm, plan.max_gradient_value, plan.gradient_norm_type
        return self.max_norm, self.max_value, 2.0

    def _clear_gradients(self) -> None:
        """Drop every gradient the device holds (the weights' and, with 16-bit emulation, their leaves')."""
        self._holding_grads = False
        for p in self.params:
            p.grad = None
        if self.half_weights is not None:
            for leaf in self.half_weights.leaves:
                leaf.grad = None

    def _optimizer_param_names(self) -> list[str]:
        """Parameter names in the order the optimizer state dict numbers them (group by group)."""
        if self.optimizer is None:
            return [n for n, _ in self.named_params]
        name_of = {id(p): n for n, p in self.named_params}
        return [name_of[id(p)] for g in self.optimizer.param_groups for p in g["params"]]

    def state_dict(self) -> dict[str, Any]:
        """The full device state, fetched to CPU: params, buffers, optimizer, scaler, global step.

        Layout: ``{"format", "global_step", "params": {name: tensor}, "buffers": {name: tensor},
        "param_names": [names in the optimizer's numbering], "optimizer": torch optimizer state_dict or None,
        "scaler": dict or None, "gradients_held": [names of the weights eager holds a gradient for]}``.
        """
        cpu = torch.device("cpu")

        def fetch(obj: Any) -> Any:
            return pytree.tree_map(lambda t: t.detach().to(cpu).clone() if isinstance(t, torch.Tensor) else t, obj)

        return {
            "format": STATE_FORMAT,
            "global_step": self._step,
            "params": {n: p.detach().to(cpu).clone() for n, p in self.module.named_parameters()},
            "buffers": {n: b.detach().to(cpu).clone() for n, b in self.module.named_buffers()},
            "param_names": self._optimizer_param_names(),
            "optimizer": fetch(self.optimizer.state_dict()) if self.optimizer is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "gradients_held": [self.named_params[i][0] for i in sorted(self._grad_held)],
        }

    def load_state_dict(self, state: dict[str, Any], *, strict: bool = True, load_optimizer: bool = True) -> None:
        """Load :meth:`state_dict` output back onto the device.

        ``strict`` requires every parameter and buffer; ``load_optimizer=False`` keeps the
        optimizer, scaler and global step as they are (a pretrained start).
        """
        params = dict(self.module.named_parameters())
        buffers = dict(self.module.named_buffers())
        given = {**state.get("params", {}), **state.get("buffers", {})}
        if strict:
            missing = sorted((set(params) | set(buffers)) - set(given))
            unexpected = sorted(set(given) - set(params) - set(buffers))
            if missing or unexpected:
                raise SpecError(f"state does not match the program: missing {missing}, unexpected {unexpected}")
        with torch.no_grad():
            for name, value in given.items():
                target = params.get(name, buffers.get(name))
                if target is None:
                    continue
                if tuple(target.shape) != tuple(value.shape):
                    raise SpecError(f"state {name}: shape {tuple(value.shape)}, program has {tuple(target.shape)}")
                target.copy_(value.to(target.dtype))
        if not load_optimizer:
            return
        if self.optimizer is not None and state.get("optimizer") is not None:
            foreach = [g.get("foreach") for g in self.optimizer.param_groups]
            # copies: torch's optimizer keeps the given tensors, and the update would change the caller's state
            self.optimizer.load_state_dict(pytree.tree_map(
                lambda t: t.clone() if isinstance(t, torch.Tensor) else t, state["optimizer"]))
            for group, flag in zip(self.optimizer.param_groups, foreach):
                group["foreach"] = flag  # how the update runs is the device's choice, not the checkpoint's
        if self.scaler is not None and state.get("scaler") is not None:
            self.scaler.load_state_dict(state["scaler"])
        step = int(state.get("global_step", self._step))
        if step < 0 or not math.isfinite(step):
            raise SpecError(f"global_step must be >= 0, got {step}")
        self._step = step
        self.global_step.fill_(step)
        held = state.get("gradients_held") or ()  # a program switch carries them; a restored run starts with none
        index = {name: i for i, (name, _) in enumerate(self.named_params)}
        self._grad_held = {index[n] for n in held if isinstance(n, str) and n in index}
