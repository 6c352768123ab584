"""The plain part of a compiled program: everything the device needs besides the graph.

A program is a ``torch.export`` ExportedProgram of the model's forward+loss plus a
:class:`ProgramSpec`. The spec is data (JSON), never code: the compiler writes it (``spec.json``
beside ``program.pt2``), the emulator builds the optimizer, the learning-rate schedule, the loss
scaler and the precision from it, and the compile hash covers its JSON form.

- :class:`ProgramSpec` — mode, input schema, optimizer, learning rate, precision, loss scaling,
  clipping, output names; :meth:`ProgramSpec.to_json` / :meth:`ProgramSpec.from_json`.
- :class:`OptimizerSpec` — an optimizer type of :mod:`csrun.program.optimizers` and its
  hyperparameters under torch's keyword names
  (:func:`csrun.program.optimizers.spec_hyperparameters` writes them from the params).
- :class:`LossScalingSpec` — fixed or dynamic; its defaults are :mod:`csrun.program.loss_scaling`.
- :class:`TensorSpec` — one leaf of the input batch. :data:`Precision` — the compute dtypes (declared here once).

``csrun.compiler.spec`` re-exports these names.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from csrun.program.loss_scaling import (
    INITIAL_LOSS_SCALE,
    MAX_LOSS_SCALE,
    MIN_LOSS_SCALE,
    STEPS_PER_INCREASE,
)

SCALAR_READS = frozenset({"aten.item.default", "aten._local_scalar_dense.default"})
"""The operators that read a tensor's value as a Python number: a program never holds one (the
capture refuses the step, as the system did; a trace would freeze the number it read)."""


def reads_a_scalar(target: object) -> bool:
    """Whether a graph node's target is one of :data:`SCALAR_READS`."""
    return str(target) in SCALAR_READS


Precision = Literal["float16", "bfloat16", "cbfloat16", "float32"]
"""The forward's compute dtype: 16-bit (mixed precision: float32 weights) or float32 (no mixed precision)."""
PRECISIONS: tuple[Precision, ...] = get_args(Precision)
"""Every :data:`Precision`, in order."""
"""Compute dtypes: the three the system had, plus float32 for exactness checks."""


@dataclass(frozen=True, kw_only=True)
class TensorSpec:
    """One leaf of the input batch: where it sits in the structure, its dtype and shape."""

    path: str
    """Where the leaf sits, e.g. ``[0]`` or ``['input_ids']`` or ``['labels'][1]``."""
    dtype: str
    """torch dtype name without the ``torch.`` prefix, e.g. ``float32``, ``int64``."""
    shape: tuple[int, ...]
    """Static shape; the first dimension is the batch size."""


@dataclass(frozen=True, kw_only=True)
class OptimizerSpec:
    """The optimizer the device runs."""

    type: str
    """One of :data:`csrun.program.optimizers.NAMES` (the optimizer table), lower case."""
    hyperparameters: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the optimizer (``lr`` excluded: it comes from the schedule),
    e.g. ``{"momentum": 0.9, "weight_decay": 0.0}``; JSON values only (lists for betas)."""
    param_groups: tuple[dict[str, Any], ...] = ()
    """Empty when one set of hyperparameters serves all parameters. Otherwise one mapping per
    torch param group: ``{"params": [parameter names], <hyperparameters that differ from
    hyperparameters>}`` (e.g. weight decay 0 for biases and norms)."""


@dataclass(frozen=True, kw_only=True)
class LossScalingSpec:
    """Loss scaling: a fixed factor, or dynamic scaling that backs off on overflow."""

    factor: float | str = 1.0
    """A number, or ``"dynamic"``."""
    initial_loss_scale: float = INITIAL_LOSS_SCALE
    steps_per_increase: int = STEPS_PER_INCREASE
    min_loss_scale: float = MIN_LOSS_SCALE
    max_loss_scale: float = MAX_LOSS_SCALE


@dataclass(frozen=True, kw_only=True)
class ProgramSpec:
    """Everything but the graph: inputs, optimizer, schedule, precision, scaling, clipping."""

    mode: str = "train"
    """``train`` (forward, backward, update) or ``eval`` (forward only)."""
    inputs: tuple[TensorSpec, ...] = ()
    """The input schema, leaves in the order of ``torch.utils._pytree.tree_flatten``."""
    input_tree: str = ""
    """The batch structure as the JSON of ``torch.utils._pytree.treespec_dumps``."""
    optimizer: OptimizerSpec | None = None
    """None for eval programs."""
    learning_rate: Any = 0.0
    """The legacy ``learning_rate`` value as in the params YAML: a number, a scheduler mapping,
    or a list of scheduler mappings run one after another."""
    precision: Precision = "float16"
    """The compute dtype of the forward pass (``float32``: mixed precision off); weights stay float32."""
    loss_scaling: LossScalingSpec = field(default_factory=LossScalingSpec)
    max_gradient_norm: float | None = None
    max_gradient_value: float | None = None
    outputs: tuple[str, ...] = ()
    """Names of the forward's outputs: ``("loss",)`` for a bare loss tensor, else the keys of the
    returned dict (``"loss"`` first). The graph's own output order is in the program."""

    def to_json(self) -> str:
        """The canonical JSON form (sorted keys): what is hashed and written to spec.json."""
        return json.dumps(asdict(self), sort_keys=True, indent=1)

    @staticmethod
    def from_json(text: str) -> "ProgramSpec":
        """Rebuild a spec from :meth:`to_json` output."""
        raw = json.loads(text)
        raw["inputs"] = tuple(TensorSpec(path=i["path"], dtype=i["dtype"], shape=tuple(i["shape"])) for i in raw["inputs"])
        opt = raw.get("optimizer")
        if opt:
            opt["param_groups"] = tuple(opt.get("param_groups", ()))
            raw["optimizer"] = OptimizerSpec(**opt)
        else:
            raw["optimizer"] = None
        raw["outputs"] = tuple(raw.get("outputs", ()))
        raw["loss_scaling"] = LossScalingSpec(**raw["loss_scaling"])
        return ProgramSpec(**raw)
