"""A step's random numbers are eager's: drawn on the host, in program order, and handed to the device.

Eager PyTorch draws a step's random numbers from one generator, in the order the script makes
them: the loop's own draws (``x + 0.1 * torch.randn_like(x)``), then the forward's (dropout),
then the loop's again. A device that drew the forward's on its own thread, from the same
generator, would interleave with the loop's at random. So the device draws nothing it can be
given: the forward's draws are made on the host, at the model call, from the global generator
(exactly the calls eager makes there, so the generator moves as eager's does), and each becomes
an input of the step. The device then computes with them as the random op would have. Dropout
with host augmentation, with or without closures, is bit for bit eager's, run after run, on any
device (a GPU gets the CPU's masks).

What is drawn on the host (:data:`DRAWN`):

* dropout (``F.dropout``, ``dropout1d/2d/3d``, ``nn.Dropout``): the mask is eager's
  ``F.dropout`` of ones, and the device multiplies the input by it (eager's own arithmetic);
* ``F.scaled_dot_product_attention`` with ``dropout_p > 0`` (float32, no grouped heads): the
  attention weights by torch's math path, times the mask, times the values, as the CPU computes it;
* draws whose numbers do not depend on the step's values: ``torch.rand``/``randn``/``randint``/
  ``randperm``/``normal`` with sizes, the ``*_like`` forms, ``torch.bernoulli(x, p)`` with a
  number ``p``, and in-place fills (``uniform_``, ``normal_``, ``bernoulli_(p)``,
  ``exponential_``, ...).

Anything else (a draw whose probabilities are the step's values: ``torch.bernoulli(probs)``,
``multinomial``, ``rrelu``, alpha dropout) stays the device's: its numbers are not eager's, and
the driver says so in one notice (:func:`csrun.driver.verify.draws_random` finds it in the program).

How: while a :class:`Draws` is active on a thread, the random functions (``F.dropout*`` and
``F.scaled_dot_product_attention`` in the functional module, where ``nn.Dropout`` and
``nn.MultiheadAttention`` look them up too; ``torch.rand*``; the tensor fills) answer that
thread's calls through it. While a step's first call runs on the host for shapes (the
recording), it draws (:meth:`Draws.recording`) and notes each draw's :class:`Draw`; a later
step's call draws the same from its notes (:func:`draw`); a replay of the recorded call (the
compile's trace, the check against eager) takes the step's drawn inputs instead
(:meth:`Draws.replaying`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

from csrun.compiler.errors import Location
from csrun.compiler.locate import caller_location, is_user_file


@dataclass(frozen=True)
class Draw:
    """One draw of a recorded call: how to make its numbers again on the host."""

    kind: str
    """``dropout``, ``attention``, ``factory``, ``like`` or ``fill``."""
    func: Any
    """The torch function eager called."""
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    args: tuple[Any, ...]
    """The call's non-tensor arguments (the tensor ones replaced by the drawn shape)."""
    kwargs: tuple[tuple[str, Any], ...]
    location: Location | None

    def make(self) -> torch.Tensor:
        """The draw's numbers, from the global generator, as eager's call draws them."""
        kwargs = dict(self.kwargs)
        if self.kind == "factory":
            return self.func(*self.args, **kwargs)
        blank = torch.empty_strided(self.shape, self.stride, dtype=self.dtype)
        if self.kind in ("dropout", "attention"):
            return self.func(blank.fill_(1), *self.args, **kwargs)
        return self.func(blank, *self.args, **kwargs)  # like / fill


_DROPOUTS = {F.dropout: F.dropout, F.dropout1d: F.dropout1d, F.dropout2d: F.dropout2d, F.dropout3d: F.dropout3d}
_ATTENTION = F.scaled_dot_product_attention
_DROPOUT = F.dropout
"""torch's own (the names in ``F`` are csrun's while a :class:`Draws` is active)."""
_FACTORIES = frozenset({torch.rand, torch.randn, torch.randint, torch.randperm, torch.normal})
_LIKES = frozenset({torch.rand_like, torch.randn_like, torch.randint_like, torch.bernoulli})
_FILLS = frozenset({"uniform_", "normal_", "bernoulli_", "exponential_", "geometric_", "log_normal_", "cauchy_",
                    "random_"})
DRAWN = (*_DROPOUTS, _ATTENTION, *_FACTORIES, *_LIKES)
"""The torch functions (besides the tensor fills :data:`_FILLS`) whose draws the host makes."""


def _bound(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], names: tuple[str, ...],
           defaults: tuple[Any, ...]) -> list[Any]:
    """Positional-or-keyword arguments by name (for the few functions handled here)."""
    out = list(args[:len(names)])
    for name, default in zip(names[len(out):], defaults[len(out):]):
        out.append(kwargs.get(name, default))
    return out


def _no_tensors(args: Any, kwargs: dict[str, Any]) -> bool:
    return not any(isinstance(a, torch.Tensor) for a in (*args, *kwargs.values()))


def plan_draw(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Draw, Callable[[torch.Tensor], Any]] | None:
    """For a random call the host can draw: its :class:`Draw` and how the call's result is made
    from the drawn numbers; None for any other call (drawn as it is, or not random)."""
    name = getattr(func, "__name__", "")
    where = caller_location()
    if func in _DROPOUTS:
        x, p, training, inplace = _bound(func, args, kwargs, ("input", "p", "training", "inplace"), (None, 0.5, True, False))
        if not isinstance(x, torch.Tensor) or not training or isinstance(p, torch.Tensor) or not 0 < float(p) < 1 \
                or x.numel() == 0:
            return None  # no draw in eager either (or p == 1: zeros)
        draw = Draw("dropout", func, tuple(x.shape), tuple(x.stride()), x.dtype, (float(p), True), (), where)
        return draw, (lambda noise: x.mul_(noise) if inplace else x * noise)
    if func is _ATTENTION:
        return _attention(args, kwargs, where)
    if func in _FACTORIES:
        if not _no_tensors(args, kwargs) or func is torch.normal and not args and "size" not in kwargs:
            return None
        return Draw("factory", func, (), (), torch.float32, tuple(args), tuple(kwargs.items()), where), (lambda n: n)
    if func in _LIKES:
        x, rest = (args[0], args[1:]) if args else (kwargs.get("input"), ())
        extra = {k: v for k, v in kwargs.items() if k != "input"}
        if not isinstance(x, torch.Tensor) or not _no_tensors(rest, extra) or (func is torch.bernoulli and not rest
                                                                              and "p" not in extra):
            return None  # torch.bernoulli(probs): its numbers depend on the step's values
        draw = Draw("like", func, tuple(x.shape), tuple(x.stride()), x.dtype, tuple(rest), tuple(extra.items()), where)
        return draw, (lambda n: n)
    if name in _FILLS and args and isinstance(args[0], torch.Tensor) and _no_tensors(args[1:], kwargs):
        x = args[0]
        draw = Draw("fill", getattr(torch.Tensor, name), tuple(x.shape), tuple(x.stride()), x.dtype, tuple(args[1:]),
                    tuple(kwargs.items()), where)
        return draw, (lambda n: x.copy_(n))
    return None


def _attention(args: tuple[Any, ...], kwargs: dict[str, Any],
               where: Location | None) -> tuple[Draw, Callable[[torch.Tensor], Any]] | None:
    q, k, v, mask, p, causal, scale, gqa = _bound(
        _ATTENTION, args, kwargs,
        ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa"),
        (None, None, None, None, 0.0, False, None, False))
    tensors = (q, k, v)
    if not all(isinstance(t, torch.Tensor) and t.dtype == torch.float32 for t in tensors) or gqa \
            or isinstance(p, torch.Tensor) or not 0 < float(p) < 1:
        return None
    shape = (*torch.broadcast_shapes(q.shape[:-2], k.shape[:-2]), q.shape[-2], k.shape[-2])
    stride = torch.empty(shape, device="meta").stride()
    draw = Draw("attention", _DROPOUT, tuple(shape), tuple(stride), q.dtype, (float(p), True), (), where)

    def attend(noise: torch.Tensor) -> torch.Tensor:
        # torch's CPU path with dropout: the math kernel's weights, eager's dropout, then the values
        _, weights = torch.ops.aten._scaled_dot_product_attention_math(q, k, v, mask, 0.0, causal, scale=scale)
        return torch.matmul(weights * noise, v)

    return draw, attend


def draw(spec: Draw) -> torch.Tensor:
    """A later step's draw of the recorded ``spec``: the same call, from the global generator."""
    with torch.no_grad():
        return spec.make()


class Draws:
    """Random calls answered from host draws (see the module manual)."""

    def __init__(self, given: list[torch.Tensor] | None) -> None:
        self._given = given
        self.made: list[tuple[Draw, torch.Tensor]] = []
        """While recording: each draw, with its numbers."""

    @classmethod
    @contextlib.contextmanager
    def recording(cls) -> Iterator["Draws"]:
        """Draw on the host, noting each draw (the recorded call's run)."""
        with _active(cls(None)) as draws:
            yield draws

    @classmethod
    @contextlib.contextmanager
    def replaying(cls, given: list[torch.Tensor]) -> Iterator["Draws"]:
        """Answer the random calls with ``given``, in order (a replay of a recorded call)."""
        with _active(cls(list(given))) as draws:
            yield draws
        if draws._given:
            raise RuntimeError(f"csrun: a replay left {len(draws._given)} drawn inputs unused")  # a csrun bug

    def call(self, original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A random call made while this is active: drawn on the host (or taken from the given
        draws) when :func:`plan_draw` can, else made as it is."""
        planned = plan_draw(original, args, kwargs)
        if planned is None:
            return original(*args, **kwargs)
        spec, result = planned
        _STATE.draws = None  # the draw and its use call torch's own functions
        try:
            if self._given is None:
                noise = draw(spec)
                self.made.append((spec, noise))
            else:
                if not self._given:
                    raise RuntimeError("csrun: a replay made more draws than the recorded call")  # a csrun bug
                noise = self._given.pop(0)
            return result(noise)
        finally:
            _STATE.draws = self


_STATE = threading.local()
_lock = threading.Lock()
_installed = 0
_PATCHED: list[tuple[Any, str, Any]] = []
"""(owner, name, original) of every function csrun answers while a :class:`Draws` is active."""


def _targets() -> list[tuple[Any, str, Any]]:
    """The random functions to answer, where scripts and torch's own modules look them up: the
    functional module's names (``nn.Dropout`` and ``F.multi_head_attention_forward`` find them
    there), ``torch``'s, and the tensor fills."""
    out: list[tuple[Any, str, Any]] = [(F, f.__name__, f) for f in (*_DROPOUTS, _ATTENTION)]
    out += [(torch, f.__name__, f) for f in (*_FACTORIES, *_LIKES)]
    out += [(torch.Tensor, name, getattr(torch.Tensor, name)) for name in sorted(_FILLS)]
    return out


_TORCH_NN = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "nn") + os.sep


def _scripts(filename: str) -> bool:
    """A call from the user's code or from torch's modules (``nn.Dropout``, ``F.multi_head_attention_forward``),
    not from torch's compiler machinery (dynamo, inductor: a compiled submodule's own draws)."""
    return filename.startswith(_TORCH_NN) or is_user_file(filename)


def _answering(original: Any) -> Any:
    def answer(*args: Any, **kwargs: Any) -> Any:
        draws = getattr(_STATE, "draws", None)
        if draws is None or not _scripts(sys._getframe(1).f_code.co_filename):
            return original(*args, **kwargs)
        return draws.call(original, args, kwargs)

    answer.__name__ = getattr(original, "__name__", "random")
    answer.__doc__ = getattr(original, "__doc__", None)
    return answer


@contextlib.contextmanager
def _active(draws: Draws) -> Iterator[Draws]:
    """``draws`` answers this thread's random calls for the block (the functions patched once,
    while any thread has one active; other threads' calls go to torch's own)."""
    global _installed
    with _lock:
        if _installed == 0:
            _PATCHED[:] = _targets()
            for owner, name, original in _PATCHED:
                setattr(owner, name, _answering(original))
        _installed += 1
    outer = getattr(_STATE, "draws", None)
    _STATE.draws = draws
    try:
        yield draws
    finally:
        _STATE.draws = outer
        with _lock:
            _installed -= 1
            if _installed == 0:
                for owner, name, original in _PATCHED:
                    setattr(owner, name, original)


_MAYBE = {id(f) for f in DRAWN}


def maybe_random(func: Any) -> bool:
    """Whether ``func`` is one of the random calls :func:`plan_draw` may draw on the host (cheap)."""
    return id(func) in _MAYBE or getattr(func, "__name__", "") in _FILLS


