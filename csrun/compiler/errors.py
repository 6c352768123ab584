"""The compiler's errors: each names the user's file and line and says what the system needs.

Every problem the compiler finds is a :class:`CompileError` (a :class:`csrun.errors.UserError`
with exit code 1). Checks collect problems instead of stopping at the first; the compile
then raises one :class:`CompileFailed` that lists them all. The wording follows the
legacy system's tracing limits (shared/seeds/002: static graph, no tensor-to-scalar reads,
stateful tensors initialised before tracing, schedules as functions of the global step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from csrun.errors import ConfigError as _ConfigError
from csrun.errors import UsageError, UserError, located


@dataclass(frozen=True, kw_only=True)
class Location:
    """Where in the user's code a problem is: file, line, function and the source line."""

    filename: str
    """Absolute path of the user's file."""
    lineno: int
    """1-based line number."""
    function: str = ""
    """The function (frame) name, e.g. ``forward``."""
    source_line: str = ""
    """The stripped text of that line (from linecache), empty when unknown."""

    def __str__(self) -> str:
        head = f"{self.filename}:{self.lineno}:" + (f" in {self.function}" if self.function else "")
        return f"{head}\n    {self.source_line}" if self.source_line else head


def at(location: Location | None) -> str:
    """``file:line: ``, the prefix of every message about a line of the user's (empty when unknown)."""
    return f"{location.filename}:{location.lineno}: " if location is not None else ""


class CompileError(UserError):
    """A problem in the user's model, optimizer, data or settings that stops a compile."""

    exit_code = 1
    fix: str = ""
    """What the system needs instead (each subclass has a default)."""

    def __init__(self, what: str, *, fix: str | None = None, location: Location | None = None) -> None:
        self.what = what
        self.fix = fix if fix is not None else type(self).fix
        self.location = location
        super().__init__(self.render())

    @property
    def filename(self) -> str | None:
        """The user's file, or None when the problem has no source line (a config value)."""
        return self.location.filename if self.location else None

    @property
    def lineno(self) -> int | None:
        """The line in :attr:`filename`, or None."""
        return self.location.lineno if self.location else None

    def render(self) -> str:
        """The full message: ``file:line: what``, the source line, and the fix."""
        return located(self.location, self.what, self.fix)


class DataDependentControlFlow(CompileError):
    """Python ``if``/``while``/``for`` that depends on a tensor's value inside the step."""

    fix = ("the system captures one static graph on the first step, so Python control flow "
           "cannot depend on tensor values; use tensor operations instead, e.g. "
           "torch.where(cond, a, b) for an if, a fixed trip count for a loop")


class TensorToScalar(CompileError):
    """Reading a tensor's value inside the step: ``.item()``, ``float(t)``, ``print(t)``, ``assert``..."""

    fix = ("tensor values are not known while the step is traced; keep them as tensors inside "
           "the step and read them in a step closure (cm.add_step_closure / @cm.step_closure), "
           "which runs when the device has produced the values")


class ShapeChanged(CompileError):
    """A batch whose structure, shapes or dtypes differ from the captured input schema."""

    fix = ("every batch must have the shapes and dtypes of the first one (the system compiles "
           "static shapes): pad to a fixed length and set drop_last=True")


class ShortLastBatch(CompileError):
    """A dataloader that can produce a smaller last batch (``drop_last=False``)."""

    fix = "drop_last must be set to True (sizes must be static on the system)"


class UnsupportedOptimizer(CompileError):
    """An optimizer the system does not have."""


class LRSchedulerNotSupported(CompileError):
    """A torch ``lr_scheduler`` attached to the optimizer."""

    fix = ("give the schedule as a function of the global step in the params "
           "(optimizer.learning_rate: a number, {scheduler: Linear, ...} or a list of them) "
           "and remove the torch lr_scheduler; the device evaluates it every step")


class GradAccumNotSupported(CompileError):
    """``grad_accum_steps`` > 1."""

    fix = ("set grad_accum_steps to 1 (or remove it) and raise batch_size instead, or train in weight-streaming "
           "mode (python-ws, or run.py --execution_strategy weight_streaming), which accepts it")


class TrainAndEvalNotSupported(CompileError):
    """``--mode train_and_eval`` on the system."""

    fix = "run --mode train, then --mode eval with the checkpoint"


class LazyOptimizerState(CompileError):
    """A custom optimizer that creates state tensors on its first step."""

    fix = ("create every optimizer state tensor before tracing, in the optimizer's __init__ "
           "(e.g. self.state[p]['momentum'] = torch.zeros_like(p) for each parameter); state "
           "created inside step() has no identity on the device and would restart at zero "
           "every step")


class CumulativeBatchNorm(CompileError):
    """A batch norm with ``momentum=None`` (a cumulative average) in a training step."""

    fix = ("its running statistics divide by the number of batches seen as a Python number at every step, which "
           "the compiled step cannot do; give it a momentum (momentum=0.1, torch's default), or a momentum that "
           "approximates the average over the run")


class WeightsNotFloat32(CompileError):
    """Model weights that are not float32 (the device keeps float32 weights)."""

    fix = ("keep the weights float32 (model.float()); for 16-bit compute turn mixed_precision on (the system "
           "stores float32 weights and casts the compute to float16/bfloat16/cbfloat16 itself) or use torch.autocast")


class UnsupportedOutput(CompileError):
    """A forward that does not return the loss (a tensor, or a dict with key ``"loss"``)."""

    fix = ("make forward(batch) return the scalar loss tensor, or a dict with key 'loss' "
           "(plus any other tensor outputs)")


class BadBatch(CompileError):
    """A batch that is not a tensor or a nested dict/tuple/list of tensors."""

    fix = "pass a tensor, or a dict/tuple/list (nested as you like) whose leaves are tensors"


ConfigError = _ConfigError
"""A bad key or value in the params (optimizer section, precision, loss scaling): the one
:class:`csrun.errors.ConfigError` (exit 2), which also takes ``fix`` and ``location``."""

Problem = CompileError | ConfigError
"""One problem a compile reports: a check's :class:`CompileError` or a :class:`ConfigError`."""


class CaptureFailed(CompileError):
    """``torch.export`` could not capture the step for a reason not covered by another check."""

    fix = ("make the step a pure tensor program: no Python decisions on tensor values, no "
           "reads of tensor values, no data-dependent shapes")


class ModelDoesNotFit(CompileError):
    """Weights, optimizer state and in-flight activations need more SRAM than the wafer has
    (pipelined), or one layer group with one sample does not fit / MemoryX is too small (weight
    streaming). The compile's fix names weight-streaming mode when a pipelined model does not fit."""

    fix = ("make the model smaller (fewer/narrower layers), use a smaller batch or sequence "
           "length, or an optimizer with less state (e.g. sgd instead of adam)")


class UnsafeProgram(CompileError):
    """A program archive that is not plain data (see csrun.program.archive), or was altered."""

    fix = "recompile the model (delete the compile directory); never load programs from untrusted places"


class CompileFailed(CompileError):
    """Several problems found in one pass; :attr:`problems` lists each one."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems: list[Problem] = list(problems)
        n = len(self.problems)
        what = f"{n} problem{'s' if n != 1 else ''} stop the compile:\n\n" + "\n\n".join(
            f"[{i}] {type(p).__name__}: " + p.render().replace("\n", "\n    ")
            for i, p in enumerate(self.problems, 1))
        super().__init__(what, fix="")


class ConflictingCompileFlags(UsageError):
    """``--compile_only`` and ``--validate_only`` given together."""


def raise_all(problems: Sequence[Problem]) -> None:
    """Raise nothing for no problems, the problem itself for one, :class:`CompileFailed` for several."""
    if not problems:
        return
    if len(problems) == 1:
        raise problems[0]
    raise CompileFailed(problems)
