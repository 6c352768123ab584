"""The optimizer table's types as torch optimizers: the classes, the builder, the learning rate and the first state.

The types, their classes and their defaults are the optimizer table,
:mod:`csrun.program.optimizers`. Names are case-insensitive and map to ``torch.optim`` classes
where one exists (``Adafactor`` is ``torch.optim.Adafactor``). LAMB is not in torch:
:class:`Lamb` implements the legacy model zoo's form (LAMB v3, no bias correction, weight norm
clamped to [0, 10]). AdamW with ``correct_bias: false`` (the model zoo's default) is
:class:`AdamWNoBiasCorrection`; otherwise ``torch.optim.AdamW``.

Hyperparameters may use torch keyword names or the legacy params keys, which are mapped by
:func:`csrun.program.optimizers.torch_hyperparameters` (``beta1``/``beta2`` -> ``betas``,
``weight_decay_rate`` -> ``weight_decay``, ...); ``exclude_from_weight_decay`` (list of name
substrings) puts matching parameters in a group with weight decay 0. Unknown keys are errors
listing the valid ones.

Optimizer state is created before the first step (:func:`preinitialize_state`), as the system
required: stateful tensors must exist before the program runs.
"""

from __future__ import annotations

import inspect
import math
from typing import Any, Collection, Iterable, Mapping, Sequence, cast

import torch

from csrun.program.errors import SpecError
from csrun.program.optimizers import (
    DEFAULT_BETAS,
    NO_BIAS_CORRECTION_EPS,
    OPTIMIZERS,
    default_eps,
    torch_hyperparameters,
)


class _AdamMoments(torch.optim.Optimizer):
    """An optimizer built on Adam's moments without bias correction.

    The moments are zero-initialised eagerly (the system created optimizer state before the
    first step). ``step`` updates them per parameter with a gradient
    (``m = b1 m + (1-b1) g``, ``v = b2 v + (1-b2) g^2``) and hands them to :meth:`_apply`.
    """

    def __init__(self, params: Iterable[Any], defaults: dict[str, Any]) -> None:
        super().__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                self._initial_state(self.state[p], p, group)

    @staticmethod
    def _zero_moments(st: dict[str, Any], p: torch.Tensor) -> None:
        st["exp_avg"] = torch.zeros_like(p)
        st["exp_avg_sq"] = torch.zeros_like(p)

    def _initial_state(self, st: dict[str, Any], p: torch.Tensor, group: dict[str, Any]) -> None:
        """The state of ``p`` before its first step (the moments at zero)."""
        self._zero_moments(st, p)

    def _gradient(self, p: torch.Tensor, group: dict[str, Any]) -> torch.Tensor:
        """The gradient the moments take (``p.grad``; step() skips weights without one)."""
        return cast(torch.Tensor, p.grad)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Apply one update to every parameter with a gradient."""
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                st = self.state[p]
                if "exp_avg" not in st:  # e.g. a loaded state without this parameter's moments
                    self._initial_state(st, p, group)
                grad = self._gradient(p, group)
                m, v = st["exp_avg"], st["exp_avg_sq"]
                m.mul_(b1).add_(grad, alpha=1 - b1)
                v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
                self._apply(p, m, v, group)
        return loss

    def _apply(self, p: torch.Tensor, m: torch.Tensor, v: torch.Tensor, group: dict[str, Any]) -> None:
        raise NotImplementedError


class Lamb(_AdamMoments):
    """LAMB (You et al. 2019, v3 of the paper) as the legacy model zoo ran it.

    Per parameter: ``m = b1 m + (1-b1) g``; ``v = b2 v + (1-b2) g^2`` (no bias correction);
    ``u = m / (sqrt(v) + eps) + wd * p``; ``r = clamp(||p||, 0, 10) / ||u||`` (1 when either norm
    is 0, or always 1 when ``adam``); ``p -= lr * r * u``. State is zero-initialised eagerly.
    """

    legacy_type = "lamb"
    """The legacy type the compiler reads off this class (:func:`csrun.compiler.optim.legacy_type_of`)."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = DEFAULT_BETAS,
        eps: float = default_eps("lamb"),  # type: ignore[assignment]
        weight_decay: float = 0.0,
        adam: bool = False,
    ) -> None:
        if lr < 0 or eps < 0 or not (0 <= betas[0] < 1) or not (0 <= betas[1] < 1):
            raise SpecError(f"lamb: invalid hyperparameters lr={lr} eps={eps} betas={betas}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, adam=adam))

    def _apply(self, p: torch.Tensor, m: torch.Tensor, v: torch.Tensor, group: dict[str, Any]) -> None:
        update = m / v.sqrt().add_(group["eps"])
        if group["weight_decay"] != 0:
            update.add_(p, alpha=group["weight_decay"])
        if group["adam"]:
            p.sub_(update, alpha=group["lr"])
            return
        w_norm = p.norm().clamp(0, 10)
        u_norm = update.norm()
        one = torch.ones((), dtype=w_norm.dtype, device=w_norm.device)
        ratio = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, one)
        p.sub_(update * (ratio * group["lr"]))


class AdamWNoBiasCorrection(_AdamMoments):
    """AdamW without bias correction (the model zoo's ``correct_bias: false``, the BERT/HF form):
    ``m = b1 m + (1-b1) g``; ``v = b2 v + (1-b2) g^2``; ``p -= lr * m / (sqrt(v) + eps)``;
    then ``p -= lr * wd * p`` (decoupled decay). State is zero-initialised eagerly."""

    legacy_type = "adamw"
    """The legacy type the compiler reads off this class (the runner builds it for ``correct_bias: false``)."""
    legacy_hyperparameters = {"correct_bias": False}
    """What the spec needs besides the param group to rebuild this class."""

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = DEFAULT_BETAS,
        eps: float = NO_BIAS_CORRECTION_EPS,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Apply one update to every parameter with a gradient: the formula above, one foreach call
        per operation over each group's parameters instead of seven Python calls per parameter
        (the foreach forms run the same per-tensor kernels on a CPU: the same bits, in far fewer
        Python calls; BERT debug's update before and after: BENCHMARKS.md)."""
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            b1, b2 = group["betas"]
            grads = [p.grad for p in params]
            m: list[torch.Tensor] = []
            v: list[torch.Tensor] = []
            for p in params:
                st = self.state[p]
                if "exp_avg" not in st:  # e.g. a loaded state without this parameter's moments
                    self._zero_moments(st, p)
                m.append(st["exp_avg"])
                v.append(st["exp_avg_sq"])
            torch._foreach_mul_(m, b1)
            torch._foreach_add_(m, grads, alpha=1 - b1)
            torch._foreach_mul_(v, b2)
            torch._foreach_addcmul_(v, grads, grads, value=1 - b2)
            denominators = torch._foreach_sqrt(v)
            torch._foreach_add_(denominators, group["eps"])
            torch._foreach_addcdiv_(params, m, denominators, value=-group["lr"])
            if group["weight_decay"] != 0:
                torch._foreach_add_(params, params, alpha=-group["lr"] * group["weight_decay"])
        return loss


class BetaPowerAdam(_AdamMoments):
    """The R1.x Model Zoo's Adam / AdamW, as the wafer ran them: bias correction from running
    ``beta1_power`` / ``beta2_power`` tensors (initialised to the betas, multiplied each step) rather
    than ``beta ** step``; an L2 term added to the gradient (``l2_regularization_rate``: the zoo's
    Adam) and a decoupled decay added to the update (``weight_decay``: its AdamW).

    Per parameter: ``g += l2 * p``; ``m = b1 m + (1-b1) g``; ``v = b2 v + (1-b2) g^2``;
    ``u = m / (sqrt(v or max(v)) + eps)``; with ``correct_bias``: ``u *= sqrt(1 - b2_power) /
    (1 - b1_power)``, then both powers times their beta; ``u += wd * p``; ``p -= lr * u``. State is
    created before the first step, as the zoo's ``preinitialize`` does. The compiler picks it for a
    torch optimizer whose groups carry ``l2_regularization_rate`` (the zoo's ``AdamBase`` family).
    """

    legacy_type = "adamw"
    """The legacy type the compiler reads off this class."""
    legacy_hyperparameters = {"beta_powers": True}
    """What the spec needs besides the param group to rebuild this class."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = DEFAULT_BETAS,
                 eps: float = 1e-6, weight_decay: float = 0.0, l2_regularization_rate: float = 0.0,
                 correct_bias: bool = True, amsgrad: bool = False, beta_powers: bool = True) -> None:
        if lr < 0 or eps < 0 or not (0 <= betas[0] < 1) or not (0 <= betas[1] < 1):
            raise SpecError(f"adamw: invalid hyperparameters lr={lr} eps={eps} betas={betas}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      l2_regularization_rate=l2_regularization_rate, correct_bias=correct_bias,
                                      amsgrad=amsgrad))

    def _initial_state(self, st: dict[str, Any], p: torch.Tensor, group: dict[str, Any]) -> None:
        """The zero moments, and the amsgrad maximum and the beta powers where the group uses them."""
        self._zero_moments(st, p)
        if group["amsgrad"]:
            st["max_exp_avg_sq"] = torch.zeros_like(p)
        if group["correct_bias"]:
            b1, b2 = group["betas"]
            st["beta1_power"] = torch.tensor(b1, device=p.device)
            st["beta2_power"] = torch.tensor(b2, device=p.device)

    def _gradient(self, p: torch.Tensor, group: dict[str, Any]) -> torch.Tensor:
        """``p.grad``, plus the L2 term."""
        grad = cast(torch.Tensor, p.grad)
        if group["l2_regularization_rate"] > 0.0:
            return grad.add(p, alpha=group["l2_regularization_rate"])
        return grad

    def _apply(self, p: torch.Tensor, m: torch.Tensor, v: torch.Tensor, group: dict[str, Any]) -> None:
        st = self.state[p]
        if group["amsgrad"]:
            torch.maximum(st["max_exp_avg_sq"], v, out=st["max_exp_avg_sq"])
            denom = st["max_exp_avg_sq"].sqrt().add_(group["eps"])
        else:
            denom = v.sqrt().add_(group["eps"])
        update = m / denom
        if group["correct_bias"]:
            one = torch.tensor(1.0, dtype=torch.float32, device=p.device)
            update *= torch.sqrt(one - st["beta2_power"]) / (one - st["beta1_power"])
            b1, b2 = group["betas"]
            st["beta1_power"] *= b1
            st["beta2_power"] *= b2
        if group["weight_decay"] > 0.0:
            update.add_(p, alpha=group["weight_decay"])
        update *= group["lr"]
        p.sub_(update)


def _class_for(name: str, hp: dict[str, Any]) -> type[torch.optim.Optimizer]:
    if name == "lamb":
        return Lamb
    if "l2_regularization_rate" in hp or hp.get("beta_powers"):  # the R1.x zoo's Adam family
        return BetaPowerAdam
    if name == "adamw" and hp.get("correct_bias", True) is False:
        return AdamWNoBiasCorrection
    return getattr(torch.optim, OPTIMIZERS[name].class_name)


def _map_legacy(name: str, hp: dict[str, Any]) -> dict[str, Any]:
    """Legacy params keys to torch keyword arguments (pairs as tuples; ``correct_bias`` chose the
    class, except for :class:`BetaPowerAdam`, which takes it)."""
    try:
        out = torch_hyperparameters(name, hp)
    except ValueError as exc:
        raise SpecError(f"optimizer: {exc}") from None
    if _class_for(name, hp) is BetaPowerAdam:
        pass
    elif name == "adamw":
        out.pop("correct_bias", None)
    elif "correct_bias" in out:
        raise SpecError(f"optimizer: correct_bias applies to adamw only, not {name}")
    for key in ("betas", "etas", "step_sizes", "eps"):
        if isinstance(out.get(key), list):
            out[key] = tuple(out[key])
    return out


FOREACH_EXACT = frozenset(name for name, entry in OPTIMIZERS.items() if entry.foreach)
"""Optimizers run with ``foreach=True`` (one kernel per operation over all weights instead of a
Python loop over them; :attr:`csrun.program.optimizers.Optimizer.foreach`): their foreach and
per-tensor updates are bit-for-bit the same, so the device still equals an eager loop, which on
a CPU uses the per-tensor path."""


def build_optimizer(
    optimizer_type: str,
    hyperparameters: dict[str, Any],
    named_params: Sequence[tuple[str, torch.nn.Parameter]],
    *,
    lr: float | Sequence[float],
    param_groups: Sequence[Mapping[str, Any]] = (),
    weight_names: Collection[str] | None = None,
) -> torch.optim.Optimizer:
    """Build the optimizer named ``optimizer_type`` over ``named_params`` with initial ``lr``
    (one per param group, or one for all).

    ``param_groups`` (the spec's): the torch param groups, each ``{"params": [names], <its own
    hyperparameters>}`` (``learning_rate`` is the schedule's business, not the optimizer's); a
    trainable weight no group names is not updated, as in torch, and a frozen one a group names
    is left out. ``weight_names``: every weight of the program, frozen ones too (None: those of
    ``named_params``). Raises :class:`SpecError` for an unknown type or keyword (naming the valid
    ones) or a group naming a weight the program lacks.
    """
    name = str(optimizer_type).lower()
    if name not in OPTIMIZERS:
        raise SpecError(
            f"optimizer: unknown optimizer_type {optimizer_type!r}; valid choices: {', '.join(OPTIMIZERS)} "
            f"(case-insensitive)"
        )
    hp = dict(hyperparameters or {})
    hp.pop("lr", None)
    hp.pop("learning_rate", None)
    tensor_lr = _tensor_lr_dtype(hp.pop(TENSOR_LR, None))
    exclude = hp.pop("exclude_from_weight_decay", None) or []
    if isinstance(exclude, str):
        exclude = [exclude]
    cls = _class_for(name, hp)
    kwargs = _map_legacy(name, hp)
    valid = _keywords(cls)
    _refuse_unknown(name, kwargs, valid)
    if exclude and param_groups:
        raise SpecError("optimizer: exclude_from_weight_decay and param_groups both split the weights; give one")
    groups: list[dict[str, Any]]
    if param_groups:
        known = set(weight_names) if weight_names is not None else {n for n, _ in named_params}
        groups = _groups_by_name(name, param_groups, named_params, valid, known)
    elif exclude:
        decay = [p for n, p in named_params if not any(x in n for x in exclude)]
        no_decay = [p for n, p in named_params if any(x in n for x in exclude)]
        groups = [g for g in ({"params": decay}, {"params": no_decay, "weight_decay": 0.0}) if g["params"]]
    else:
        groups = [{"params": [p for _, p in named_params]}]
    rates = [float(lr)] * len(groups) if isinstance(lr, (int, float)) else [float(x) for x in lr]
    if len(rates) != len(groups):
        raise SpecError(f"optimizer: {len(rates)} learning rates for {len(groups)} param groups")
    for group, rate in zip(groups, rates):
        group["lr"] = rate if tensor_lr is None else torch.tensor(rate, dtype=tensor_lr)
    if name in FOREACH_EXACT and "foreach" in valid and "foreach" not in kwargs:
        kwargs["foreach"] = tensor_lr is None  # torch's foreach forms take no tensor lr (the script's ran per tensor)
    first: Any = rates[0] if tensor_lr is None else torch.tensor(rates[0], dtype=tensor_lr)
    try:
        return cls(groups, lr=first, **kwargs)  # type: ignore[call-arg]  # cls is a concrete optimizer class, not the base
    except (TypeError, ValueError) as exc:
        raise SpecError(f"optimizer: {name}: {exc}") from None


TENSOR_LR = "tensor_lr"
"""The spec hyperparameter saying the script's optimizer holds its learning rate as a tensor
(``Adam(params, lr=torch.tensor(1e-3))``), with that tensor's dtype: torch's update then computes
with it as a tensor, and so does the engine's, for the same bits."""

_TENSOR_LR_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _tensor_lr_dtype(value: Any) -> torch.dtype | None:
    if value is None:
        return None
    if value not in _TENSOR_LR_DTYPES:
        raise SpecError(f"optimizer: {TENSOR_LR} is {value!r}; valid: {', '.join(_TENSOR_LR_DTYPES)}")
    return _TENSOR_LR_DTYPES[value]


def _keywords(cls: type[torch.optim.Optimizer]) -> list[str]:
    """The hyperparameter keywords an optimizer class takes."""
    sig = inspect.signature(cls.__init__)
    return [p for p in sig.parameters if p not in ("self", "params", "lr", "defaults")]


def _refuse_unknown(name: str, kwargs: Mapping[str, Any], valid: Sequence[str]) -> None:
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise SpecError(
            f"optimizer: {name} does not take {unknown}; valid keys: {', '.join(valid)} "
            f"(legacy spellings beta1/beta2, weight_decay_rate, ... are mapped)"
        )


def _groups_by_name(name: str, param_groups: Sequence[Mapping[str, Any]],
                    named_params: Sequence[tuple[str, torch.nn.Parameter]], valid: Sequence[str],
                    known: set[str]) -> list[dict[str, Any]]:
    """The spec's param groups as torch groups over the program's weights (frozen weights dropped)."""
    trainable = dict(named_params)
    groups: list[dict[str, Any]] = []
    seen: set[str] = set()
    for i, spec_group in enumerate(param_groups):
        names = spec_group.get("params")
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            raise SpecError(f"optimizer: param_groups[{i}].params must be a list of weight names")
        unknown = sorted(set(names) - known)
        if unknown:
            raise SpecError(f"optimizer: param_groups[{i}] names {unknown}, which the program has no weight of")
        twice = sorted(seen.intersection(names))
        if twice:
            raise SpecError(f"optimizer: param_groups[{i}] names {twice} again (a weight belongs to one group)")
        seen.update(names)
        own = _map_legacy(name, {k: v for k, v in spec_group.items() if k not in ("params", "learning_rate")})
        _refuse_unknown(name, own, valid)
        groups.append({"params": [trainable[n] for n in names if n in trainable], **own})
    return groups


def preinitialize_state(optimizer: torch.optim.Optimizer) -> None:
    """Create the optimizer's state before the first step.

    torch optimizers create state lazily inside ``step()``. Here one dry step runs with zero
    gradients and weight decay switched off, parameters are restored, and the counters it moved
    are rewound (``step`` to 0, NAdam ``mu_product`` to 1, ASGD ``eta`` to the lr, ``mu`` to 1,
    ``ax`` to 0). The state is then exactly what the first real step would have created, so
    training matches an eager loop bit for bit. Optimizers that create state eagerly
    (:class:`Lamb`, :class:`AdamWNoBiasCorrection`, :class:`BetaPowerAdam`) are left alone.
    """
    if isinstance(optimizer, (Lamb, AdamWNoBiasCorrection, BetaPowerAdam)):
        return
    params = [p for g in optimizer.param_groups for p in g["params"]]
    saved = [p.detach().clone() for p in params]
    saved_grads = [p.grad for p in params]
    saved_wd = [g.get("weight_decay") for g in optimizer.param_groups]
    for g in optimizer.param_groups:
        if "weight_decay" in g:
            g["weight_decay"] = 0.0
    try:
        for p in params:
            p.grad = torch.zeros_like(p)
        optimizer.step()
    finally:
        with torch.no_grad():
            for p, s, gr in zip(params, saved, saved_grads):
                p.copy_(s)
                p.grad = gr
        for g, wd in zip(optimizer.param_groups, saved_wd):
            if wd is not None:
                g["weight_decay"] = wd
    lr_of = {id(p): g["lr"] for g in optimizer.param_groups for p in g["params"]}
    for p, st in optimizer.state.items():
        for key, val in list(st.items()):
            if key == "step":
                if torch.is_tensor(val):
                    val.zero_()
                else:
                    st[key] = 0
            elif key == "mu_product" or (key == "mu" and isinstance(optimizer, torch.optim.ASGD)):
                if torch.is_tensor(val):
                    val.fill_(1.0)
                else:
                    st[key] = 1.0
            elif key == "eta" and isinstance(optimizer, torch.optim.ASGD):
                val.fill_(float(lr_of[id(p)]))
            elif key == "ax" and isinstance(optimizer, torch.optim.ASGD):
                val.zero_()


def set_learning_rate(optimizer: torch.optim.Optimizer, lr: float | Sequence[float]) -> None:
    """Set the learning rate of every group (one value), or of each group (one per group): the
    schedules' values for this step (a tensor ``lr`` is filled in place, as torch's schedulers do)."""
    groups = optimizer.param_groups
    rates = [lr] * len(groups) if isinstance(lr, (int, float)) else lr
    for g, rate in zip(groups, rates):
        if not math.isfinite(rate):
            raise SpecError(f"learning_rate: the schedule gave a non-finite value {rate}")
        if isinstance(g["lr"], torch.Tensor):
            g["lr"].fill_(rate)
        else:
            g["lr"] = rate


def set_hyperparameter(group: dict[str, Any], key: str, value: Any) -> None:
    """Set one hyperparameter of a param group to a value the script gave its own group (a number,
    a flag, a pair such as ``betas``), in the form the group holds it: a tensor is filled in place,
    a pair stays a tuple; raises :class:`SpecError` for a value of another form."""
    held = group[key]
    if isinstance(held, torch.Tensor) and not isinstance(value, (bool, tuple)):
        held.fill_(value)
    elif isinstance(held, bool) or isinstance(value, bool):
        if not (isinstance(held, bool) and isinstance(value, bool)):
            raise SpecError(f"step plan: {key} is {held!r} on the device, the script set {value!r}")
        group[key] = value
    elif isinstance(held, (tuple, list)):
        if not isinstance(value, tuple) or len(value) != len(held):
            raise SpecError(f"step plan: {key} is {tuple(held)!r} on the device, the script set {value!r}")
        group[key] = tuple(value)
    elif isinstance(value, tuple) or not isinstance(held, (int, float)):
        raise SpecError(f"step plan: {key} is {held!r} on the device, the script set {value!r}")
    else:
        group[key] = value
