"""The user's model and optimizer show the device's state: reads fetch it, loads reach it.

On the device path the weights and optimizer state live on the device; the user's torch
objects are the CPU copies. Legacy scripts read them anyway (``torch.save(model.state_dict(),
...)`` in a step closure, ``model.fc.weight`` after the Session), so the wrapped objects keep
them coherent:

* **Reads.** Once the device has run a training step the CPU copies are *stale*. The next read
  through the torch objects — an attribute that is a parameter, buffer or submodule
  (``nn.Module.__getattr__``), ``state_dict()``, ``parameters()`` / ``named_parameters()`` /
  ``buffers()`` (``_named_members``), the optimizer's ``state_dict()`` — first fetches the
  device's state (``get_state()``, which waits for the steps sent so far) and copies it into
  the CPU tensors in place. Reads in a step closure see the state after that closure's step;
  reads mid-step see the state before it. Between steps nothing is fetched: reading costs one
  fetch per step at most, and ``get_state()`` stays the fast path. A read after
  ``optimizer.step()`` in the same step is refused at its line (:class:`ReadAfterUpdate`): eager
  PyTorch would show the weights that step updated, which exist on the device only once the
  step has run (a step closure sees them).
* **Changes.** What the script changes in the host copies (an edit of a weight, a
  ``requires_grad_``) is for :mod:`csrun.driver.coherence` to carry to the device: the view tells
  its listener when the copies are refreshed or loaded, and when ``requires_grad_`` is called.
* **Loads.** ``model.load_state_dict(...)`` and ``optimizer.load_state_dict(...)`` load the CPU
  copies as torch does, then the device's copy (now when a program is loaded, else with the
  program when it is).

A copy of the model (``copy.deepcopy(model)``: a teacher, an EMA, ``AveragedModel``;
``torch.save(model)``) is a plain module of the user's own classes, holding the device's values
(the read above), without csrun's routing: it runs eagerly on the host, as eager's copy would.

How: each module of the wrapped model gets a subclass of its own class (same name, module
and qualified name; created once per class) that overrides those methods; the optimizer's
``state_dict`` / ``load_state_dict`` become instance attributes. The driver's own use of the
objects (compile, state translation) runs inside :meth:`StateView.internal` and never fetches.
"""

from __future__ import annotations

import contextlib
import copyreg
from typing import Any, Callable, Iterator, Mapping, Protocol

import torch

from csrun.compiler.errors import at
from csrun.compiler.locate import caller_location
from csrun.errors import UserError


class ReadAfterUpdate(UserError):
    """The model's weights (or the optimizer's state) read after ``optimizer.step()`` in the same step."""


class SyncListener(Protocol):
    """Who hears when the host copies and the device's state are made equal (the driver's
    :class:`~csrun.driver.coherence.Coherence`)."""

    def before_refresh(self) -> None:
        """The host copies are about to be overwritten with the device's values."""

    def refreshed(self, values: Mapping[str, torch.Tensor]) -> None:
        """The host copies now hold ``values`` (the model's state by name), the device's."""

    def state_loaded(self, *, host_current: bool) -> None:
        """A state was loaded into the device and the host copies."""

    def trainable_changed(self) -> None:
        """The script called ``requires_grad_`` on one of the model's modules (at the caller's line)."""

    def optimizer_loaded(self) -> None:
        """The optimizer's ``load_state_dict`` replaced its state dict."""


class StateSource(Protocol):
    """What the view needs from the driver."""

    def device_state(self) -> Mapping[str, Any] | None:
        """The legacy state on the device (waits for sent steps), or None when nothing is loaded."""

    def load_model_state(self, state: Mapping[str, Any], strict: bool) -> None:
        """Load a model ``state_dict`` onto the device (if a program is loaded)."""

    def load_optimizer_state(self, state: Mapping[str, Any]) -> None:
        """Load an optimizer ``state_dict`` onto the device (if a program is loaded)."""


_CLASSES: dict[type, type] = {}


class StateView:
    """Keeps one wrapped model and optimizer coherent with the device (see the module manual)."""

    def __init__(self, source: StateSource, listener: SyncListener | None = None) -> None:
        self._source = source
        self.listener = listener
        self._internal = 0
        self.stale = False
        """The device has run steps since the CPU copies were last refreshed."""
        self.after_update = False
        """The open step called ``optimizer.step()``: its updated state exists on the device only."""
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None

    @contextlib.contextmanager
    def internal(self) -> Iterator[None]:
        """The driver's own reads: never fetch."""
        self._internal += 1
        try:
            yield
        finally:
            self._internal -= 1

    def read(self, what: str) -> None:
        """The script reads ``what`` through the torch objects: refused after ``optimizer.step()``
        in the open step (see the module manual), else the CPU copies are brought up to date."""
        if self.after_update and not self._internal:
            raise ReadAfterUpdate(
                f"{at(caller_location())}this reads {what} after optimizer.step() in the same step: eager PyTorch "
                "would show the values that step updated, which exist on the device once the step has run; read "
                "them in a step closure (cbtorch.add_step_closure / @step_closure), or before optimizer.step()")
        self.refresh()

    def refresh(self) -> None:
        """Fetch the device's state into the CPU copies if they are stale."""
        if not self.stale or self._internal or self.model is None:
            return
        with self.internal():
            if self.listener is not None:
                self.listener.before_refresh()
            state = self._source.device_state()
            if state is None:
                return
            self.stale = False
            values = state.get("model", {})
            copy_into(self.model, values)
            if self.listener is not None:
                self.listener.refreshed(values)

    # -- the model ----------------------------------------------------------------------------

    def attach_model(self, model: torch.nn.Module) -> None:
        """Give every module of ``model`` the coherent subclass of its class."""
        self.model = model
        for module in model.modules():
            module.__class__ = _coherent_class(type(module))
            module.__dict__["_csrun_state_view"] = self

    def model_loaded(self, state: Mapping[str, Any], strict: bool) -> None:
        """``load_state_dict`` on the wrapped model: the device's copy follows."""
        if not self._internal:
            with self.internal():
                self._source.load_model_state(state, strict)
            self.stale = False
            if self.listener is not None:
                self.listener.state_loaded(host_current=True)

    # -- the optimizer ------------------------------------------------------------------------

    def attach_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.state_dict()`` shows the device's; ``load_state_dict`` reaches it."""
        self.optimizer = optimizer
        view = self
        own_state_dict = optimizer.state_dict
        own_load = optimizer.load_state_dict

        def state_dict() -> dict[str, Any]:
            if not view._internal:
                view.read("the optimizer's state")
                with view.internal():
                    state = view._source.device_state()
                if state is not None and state.get("optimizer"):
                    return dict(state["optimizer"])
            return own_state_dict()

        def load_state_dict(state: Mapping[str, Any]) -> None:
            own_load(dict(state))
            if view.listener is not None:
                view.listener.optimizer_loaded()  # torch replaced its state dict
            if not view._internal:
                with view.internal():
                    view._source.load_optimizer_state(state)

        optimizer.state_dict = state_dict  # type: ignore[method-assign]
        optimizer.load_state_dict = load_state_dict  # type: ignore[method-assign,assignment]


def copy_into(model: torch.nn.Module, values: Mapping[str, Any]) -> None:
    """Copy ``values`` (a model state by name) into the model's tensors in place, where the shapes fit."""
    own = dict(model.state_dict(keep_vars=True))
    with torch.no_grad():
        for name, value in values.items():
            target = own.get(name)
            if isinstance(target, torch.Tensor) and isinstance(value, torch.Tensor) and target.shape == value.shape:
                target.copy_(value.to(target.dtype))


_ROUTED = "_csrun_routed"
"""Marks a function csrun put on the wrapped model as an instance attribute (its routed ``forward``)."""


def mark_routed(function: Callable[..., Any]) -> None:
    """Mark ``function`` (an instance attribute csrun sets on the wrapped model) as csrun's: a copy
    of the model goes without it."""
    setattr(function, _ROUTED, True)


def _plain_state(module: torch.nn.Module) -> dict[str, Any]:
    """A module's ``__dict__`` without csrun's additions (the view, the routed methods)."""
    return {k: v for k, v in module.__dict__.items()
            if k != "_csrun_state_view" and not getattr(v, _ROUTED, False)}


def _view_of(module: torch.nn.Module) -> StateView | None:
    return module.__dict__.get("_csrun_state_view")


def _coherent_class(cls: type[torch.nn.Module]) -> type[torch.nn.Module]:
    """``cls`` with reads that refresh from the device first (cached per class)."""
    if cls in _CLASSES.values():
        return cls
    made = _CLASSES.get(cls)
    if made is not None:
        return made
    base_getattr: Callable[[Any, str], Any] = cls.__getattr__  # type: ignore[attr-defined]

    def __getattr__(self: torch.nn.Module, name: str) -> Any:
        view = self.__dict__.get("_csrun_state_view")
        if view is not None and (view.stale or view.after_update) and (
                name in self.__dict__.get("_parameters", ()) or name in self.__dict__.get("_buffers", ())):
            view.read(f"the model's {name!r}")
        return base_getattr(self, name)

    def state_dict(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        view = _view_of(self)
        if view is not None:
            view.read("the model's state_dict()")
        return cls.state_dict(self, *args, **kwargs)

    def _named_members(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        view = _view_of(self)
        if view is not None:
            view.read("the model's parameters or buffers")
        return cls._named_members(self, *args, **kwargs)  # type: ignore[attr-defined]

    def load_state_dict(self: torch.nn.Module, state_dict: Mapping[str, Any], strict: bool = True,
                        assign: bool = False) -> Any:
        result = cls.load_state_dict(self, state_dict, strict=strict, assign=assign)
        view = _view_of(self)
        if view is not None and view.model is self:
            view.model_loaded(state_dict, strict)
        return result

    def requires_grad_(self: torch.nn.Module, requires_grad: bool = True) -> Any:
        view = _view_of(self)
        if view is not None and view.listener is not None:
            view.listener.trainable_changed()
        with view.internal() if view is not None else contextlib.nullcontext():
            return cls.requires_grad_(self, requires_grad)

    def __reduce_ex__(self: torch.nn.Module, protocol: Any) -> Any:
        view = _view_of(self)
        if view is not None:
            view.read("a copy of the model")  # a copy holds the device's values, as eager's would
        return copyreg.__newobj__, (cls,), _plain_state(self)  # type: ignore[attr-defined]  # the user's own class: a plain module

    made = type(cls.__name__, (cls,), {
        "__getattr__": __getattr__, "state_dict": state_dict, "_named_members": _named_members,
        "load_state_dict": load_state_dict, "requires_grad_": requires_grad_, "__reduce_ex__": __reduce_ex__,
        "__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__,
    })
    _CLASSES[cls] = made
    return made
