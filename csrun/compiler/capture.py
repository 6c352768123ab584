"""Capture the training step (forward + loss) once, with ``torch.export``, into a program.

The model's ``forward(batch)`` runs under ``torch.export.export(..., strict=False)`` (the
training IR: autograd through ``ep.module()`` gives the eager loss and gradients). While it
runs, the tensor methods that need a tensor's *value* are wrapped — ``__bool__``
(``if``/``while``/``assert``), ``item``, ``__float__``/``__int__``/``__index__``, ``tolist``,
``numpy``, ``__repr__``/``__format__`` (``print``) — when the user's own code makes them. Each
becomes a problem at the user's file and line, the call gets a stand-in value so tracing
goes on, and every such problem of the step is reported in one pass. Failures torch.export
raises itself (e.g. a data-dependent guard deeper in torch) are located the same way.
"""

from __future__ import annotations

import contextlib
import io
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch
import torch.utils._pytree as pytree

from csrun.compiler.errors import (
    BadBatch, CaptureFailed, CompileError, DataDependentControlFlow, Location, TensorToScalar,
    UnsupportedOutput,
)
from csrun.compiler.locate import (
    caller_location,
    definition_location,
    is_user_file,
    location_of,
    user_frame_in_exception,
    user_frame_in_message,
)
from csrun.compiler.python_globals import writes_collected
from csrun.compiler.python_state import forward_changes, in_forward
from csrun.compiler.settings import CompileSettings
from csrun.compiler.spec import ProgramSpec, TensorSpec
from csrun.program.spec import reads_a_scalar

_VALUE_READS = frozenset({"__bool__", "item", "__float__", "__int__", "__index__", "tolist", "numpy",
                          "__array__", "__repr__", "__str__", "__format__"})
_CONTROL_WORDS = ("if ", "elif ", "while ", "for ")


@dataclass(kw_only=True)
class Capture:
    """The captured step: the exported program, its spec, and any problems found."""

    program: torch.export.ExportedProgram | None
    """The training-IR program (None when the capture failed)."""
    spec: ProgramSpec | None
    """Input schema + settings (None when the batch itself was unusable)."""
    problems: list[CompileError] = field(default_factory=list)
    """Everything wrong with the step, in the order found."""
    seconds: float = 0.0
    """Wall time of the torch.export call."""


def input_schema(batch: Any) -> tuple[tuple[TensorSpec, ...], str]:
    """The batch's leaves as :class:`TensorSpec` (pytree order) and its treespec JSON.

    Raises :class:`BadBatch` when a leaf is not a tensor.
    """
    leaves_with_path, treespec = pytree.tree_flatten_with_path(batch)
    specs = []
    for path, leaf in leaves_with_path:
        where = pytree.keystr(path) or "<batch>"
        if not isinstance(leaf, torch.Tensor):
            raise BadBatch(f"batch leaf {where} is a {type(leaf).__name__}, not a tensor", location=caller_location())
        specs.append(TensorSpec(path=where, dtype=str(leaf.dtype).removeprefix("torch."), shape=tuple(int(d) for d in leaf.shape)))
    return tuple(specs), pytree.treespec_dumps(treespec)


def _classify(func_name: str, loc: Location) -> CompileError:
    line = loc.source_line
    if func_name in ("__repr__", "__str__", "__format__"):
        return TensorToScalar("printing or formatting a tensor reads its value inside the step", location=loc)
    if func_name in ("numpy", "__array__", "tolist"):
        return TensorToScalar(f"`.{func_name.strip('_')}()` copies a tensor's value to Python inside the step", location=loc)
    if func_name == "__bool__":
        if line.startswith("assert"):
            return TensorToScalar("`assert` on a tensor's value inside the step", location=loc)
        word = next((w.strip() for w in _CONTROL_WORDS if line.startswith(w)), "a Python condition")
        return DataDependentControlFlow(f"Python control flow (`{word}`) on a tensor's value inside the step", location=loc)
    # item / __float__ / __int__ / __index__
    if line.startswith(_CONTROL_WORDS) or "range(" in line:
        word = next((w.strip() for w in _CONTROL_WORDS if line.startswith(w)), "range")
        return DataDependentControlFlow(f"Python control flow (`{word}`) on a tensor's value (converted with {func_name}) inside the step", location=loc)
    what = {"item": "`.item()`", "__float__": "`float(tensor)`", "__int__": "`int(tensor)`", "__index__": "using a tensor as an index/int"}[func_name]
    return TensorToScalar(f"{what} turns a tensor into a Python number inside the step", location=loc)


def _stand_in(func_name: str, tensor: Any) -> Any:
    shape = tuple(getattr(tensor, "shape", ()))
    if func_name == "__bool__":
        return True
    if func_name in ("item", "__float__"):
        return 1.0 if getattr(tensor, "is_floating_point", lambda: True)() else 1
    if func_name in ("__int__", "__index__"):
        return 1
    if func_name == "tolist":
        return np.zeros(shape).tolist()
    if func_name in ("numpy", "__array__"):
        return np.zeros(shape, dtype=np.float32)
    return "tensor(<traced: value known only on the device>)"


_MISSING = object()


@contextlib.contextmanager
def tensors_put_back(model: torch.nn.Module) -> Any:
    """Run the model's forward without leaving a trace in its state: buffers and plain tensor
    attributes (``self.step = torch.tensor(0)``, which torch.export lifts as a constant and
    mutates for real) get their values back afterwards."""
    saved = [(b, b.detach().clone()) for b in model.buffers()]
    for module in model.modules():
        for value in vars(module).values():
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                saved.append((value, value.detach().clone()))
    try:
        yield
    finally:
        with torch.no_grad():
            for tensor, copy in saved:
                tensor.copy_(copy)


def _tensor_classes() -> list[type]:
    classes: list[type] = [torch.Tensor]
    try:
        from torch._subclasses.fake_tensor import FakeTensor
        from torch._subclasses.functional_tensor import FunctionalTensor

        classes += [FakeTensor, FunctionalTensor]
    except ImportError:  # pragma: no cover - older torch
        pass
    return classes


class _ValueReadSpy:
    """Records value reads made directly by user code and answers them with stand-ins.

    While active (one capture at a time, on the capturing thread only), the value-reading
    methods of ``torch.Tensor`` (and of the fake/functional subclasses that override them)
    are wrapped. A wrapper looks at its immediate caller: the user's own file -> a problem
    at that line and a stand-in value; anything else (torch itself, csrun, other threads)
    -> the original method. Wrapping the methods instead of using a torch-function mode
    keeps the cost of every other op at zero.
    """

    def __init__(self) -> None:
        self.problems: list[CompileError] = []
        self._seen: set[tuple[str, int, str]] = set()
        self._hits: dict[tuple[str, int, str], int] = {}
        self._thread = 0
        self._saved: list[tuple[type, str, Any]] = []

    def __enter__(self) -> "_ValueReadSpy":
        self._thread = threading.get_ident()
        with _SPY_LOCK:
            for cls in _tensor_classes():
                for name in _VALUE_READS:
                    if cls is not torch.Tensor and name not in cls.__dict__:
                        continue
                    original = getattr(cls, name, None)
                    if original is None:
                        continue
                    self._saved.append((cls, name, cls.__dict__.get(name, _MISSING)))
                    setattr(cls, name, self._wrap(name, original))
        return self

    def __exit__(self, *exc: Any) -> None:
        with _SPY_LOCK:
            for cls, name, saved in reversed(self._saved):
                if saved is _MISSING:
                    delattr(cls, name)
                else:
                    setattr(cls, name, saved)
            self._saved.clear()

    def _wrap(self, name: str, original: Callable) -> Callable:
        spy = self

        def wrapper(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() == spy._thread:
                frame = sys._getframe(1)
                filename = frame.f_code.co_filename
                if is_user_file(filename):
                    return spy._record(name, tensor, location_of(filename, frame.f_lineno, frame.f_code.co_name))
            return original(tensor, *args, **kwargs)

        wrapper.__name__ = name
        return wrapper

    def _record(self, name: str, tensor: Any, loc: Location) -> Any:
        key = (loc.filename, loc.lineno, name)
        self._hits[key] = hits = self._hits.get(key, 0) + 1
        if hits > 10_000:
            raise RuntimeError(f"tracing stopped: {loc.filename}:{loc.lineno} reads a tensor value in an endless loop")
        if key not in self._seen:
            self._seen.add(key)
            problem = _classify(name, loc)
            if not any(p.location == loc and type(p) is type(problem) for p in self.problems):
                self.problems.append(problem)
        if name == "__bool__":
            return hits == 1  # True once, then False: `while` loops end, `if` bodies run once
        return _stand_in(name, tensor)


_SPY_LOCK = threading.Lock()


def _error_from_export_failure(exc: BaseException, *, after_stand_in: bool = False) -> CompileError | None:
    """The problem for an exception torch.export raised; None for the step's own exception after a
    value read was answered with a stand-in (``if y.max() < 0: raise ...`` took the ``if`` on a
    made-up value): it follows from the read already reported, not from the step."""
    loc = user_frame_in_exception(exc)
    text = f"{type(exc).__name__}: {exc}"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    data_dependent = any(s in text for s in ("data-dependent", "GuardOnDataDependent", "_local_scalar_dense", "Could not guard"))
    if data_dependent and loc is not None:
        line = loc.source_line
        if line.startswith(_CONTROL_WORDS) or "range(" in line:
            return DataDependentControlFlow(f"Python control flow on a tensor's value inside the step ({first})", location=loc)
        return TensorToScalar(f"this line needs a tensor's value while the step is traced ({first})", location=loc)
    module = type(exc).__module__
    tracing = module.startswith(("torch._dynamo", "torch.fx", "torch._export", "torch.export", "torch._subclasses")) \
        or "Unsupported" in type(exc).__name__
    if not tracing:
        if after_stand_in:
            return None
        return CaptureFailed(f"the step raised {type(exc).__name__} while it was traced: {first}",
                             fix="fix the error in the step; it must first run eagerly on CPU "
                                 "(the csrun_cpu validation run) with this same batch",
                             location=loc or caller_location())
    return CaptureFailed(f"torch.export could not capture the step: {first}", location=loc or caller_location())




def _scalar_decays(program: torch.export.ExportedProgram) -> list[CompileError]:
    """A tensor of the step decayed to a Python number inside torch (no user ``.item()`` the spy
    saw): a tensor passed where an op takes a Scalar, e.g. ``addcdiv(..., value=<tensor>)``
    (seed 002: "Avoid Decaying Traced Tensors to Scalars"). The graph would carry an unbacked
    symbol, which the program archive refuses and a trace would freeze."""
    found: list[CompileError] = []
    for node in program.graph.nodes:
        if node.op != "call_function" or not reads_a_scalar(node.target):
            continue
        users = [getattr(u.target, "__name__", str(u.target)) for u in node.users]
        loc = user_frame_in_message(node.meta.get("stack_trace") or "") or caller_location()
        used = f" (passed to {', '.join(sorted(set(users)))} where it takes a number)" if users else ""
        problem = TensorToScalar(
            f"a tensor of the step is turned into a Python number{used}; the system raised 'SyncTensor called "
            "outside of MarkStep' here", location=loc,
            fix="pass a Python number there, or compute with tensor operations instead (addcdiv's value: "
                "x + value * t1 / t2; add's alpha: x + alpha * y)")
        if not any(p.location == loc for p in found):
            found.append(problem)
    return found


def _output_names(program: torch.export.ExportedProgram) -> tuple[tuple[str, ...], CompileError | None]:
    out_spec = program.call_spec.out_spec
    output_node = next(n for n in program.graph.nodes if n.op == "output")
    n_user = len(program.graph_signature.user_outputs)
    vals = [getattr(a, "meta", {}).get("val") for a in output_node.args[0]][-n_user:] if n_user else []
    loc = None
    if out_spec is None or out_spec.is_leaf():
        names: tuple[str, ...] = ("loss",)
        loss_val = vals[0] if vals else None
    elif out_spec.type is dict and "loss" in (out_spec.context or []):
        keys = [str(k) for k in out_spec.context]
        children = out_spec.children() if hasattr(out_spec, "children") else out_spec.children_specs
        if any(not c.is_leaf() for c in children):
            return (), UnsupportedOutput("forward returned a dict with nested values", location=loc)
        loss_val = vals[keys.index("loss")] if len(vals) == len(keys) else None
        names = ("loss",) + tuple(k for k in keys if k != "loss")
    else:
        return (), UnsupportedOutput(f"forward returned a {getattr(out_spec.type, '__name__', out_spec.type)} without a 'loss' entry", location=loc)
    if isinstance(loss_val, torch.Tensor) and (loss_val.numel() != 1 or not loss_val.is_floating_point()):
        return names, UnsupportedOutput(f"the loss must be a scalar float tensor, got shape {tuple(loss_val.shape)} {loss_val.dtype}", location=loc)
    return names, None


def capture(model: torch.nn.Module, batch: Any, *, settings: CompileSettings) -> Capture:
    """Capture ``model.forward(batch)`` in the settings' mode and build the program spec.

    Never raises for problems in the user's step: they are returned in
    :attr:`Capture.problems` (with the program None when torch.export gave up).
    """
    import time

    try:
        inputs, tree = input_schema(batch)
    except CompileError as e:
        return Capture(program=None, spec=None, problems=[e])
    was_training = model.training
    model.train(settings.program_mode == "train")
    spy = _ValueReadSpy()
    program = None
    problems: list[CompileError] = []
    t0 = time.perf_counter()
    err = io.StringIO()
    failed = False
    assigned: list[Any] = []
    try:
        # torch.export prints the partial graph to stderr when it fails; keep that out of the
        # user's way (the problem list says what matters) and replay stderr on success.
        # the forward's own prints were seen when the step ran on the host: the trace does not repeat them
        with spy, contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), tensors_put_back(model), \
                in_forward(model) as assigned, writes_collected() as global_writes:
            program = torch.export.export(model, (batch,), strict=False)
    except Exception as exc:  # torch.export reports user problems as many exception types
        failed = True
        problem = _error_from_export_failure(exc, after_stand_in=bool(spy.problems))
        if problem is not None:
            problems.append(problem)
    finally:
        model.train(was_training)
        if not failed and err.getvalue():
            sys.stderr.write(err.getvalue())
    seconds = time.perf_counter() - t0
    problems = spy.problems + [p for p in problems if not any(p.location == q.location for q in spy.problems)]
    problems += forward_changes(assigned, model)
    problems += global_writes
    outputs: tuple[str, ...] = ()
    if program is not None:
        problems += _scalar_decays(program)
        outputs, bad = _output_names(program)
        if bad is not None:
            problems.append(UnsupportedOutput(bad.what, location=definition_location(type(model).forward) or caller_location()))
    spec = settings.program_spec(inputs=inputs, input_tree=tree, outputs=outputs)
    return Capture(program=None if problems else program, spec=spec, problems=problems, seconds=seconds)
