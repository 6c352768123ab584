"""``cstorch.utils.data``: the input function and the executor that runs the training loop.

:class:`DataLoader` ``(input_fn, *args, **kwargs)`` holds the function that builds the
torch ``DataLoader`` (called once per task, when the executor first needs it). Iterating it
directly is refused: its batches come from a :class:`DataExecutor`.
:meth:`DataLoader.streaming` is the cbtorch loader it becomes (its ``skip(n)`` starts the
sequence at global batch ``n``: a resumed script's data position).

:class:`DataExecutor` ``(dataloader, num_steps=None, checkpoint_steps=None, cs_config=None)``
is what ``for batch in executor:`` iterates. It wraps the loader with ``cbtorch.dataloader``
(sharding, the system's dtype rules) and runs the loop inside a ``cbtorch.Session``: under
``csrun_wse`` every task but the chief streams its shard to the chief and exits 0 when the
chief is done (the existing streaming: same fixed order, same input table); as one task the
loader runs in-process. Each batch handed out is a step: the previous step's closures run
before it, the traced step (``@cstorch.trace``) runs on it, and the step ends at the next
batch or when the loop ends.

``num_steps``: steps to run (None: one pass over the loader; more than a pass continues into
the next epochs). ``checkpoint_steps``: every so many steps, and at the last step,
:attr:`DataExecutor.on_checkpoint_step` is True and ``@cstorch.checkpoint_closure`` runs.
``cs_config``: a :class:`~csrun.pytorch.utils.CSConfig`, checked against the job when the
loop starts. ``writer``: a :class:`~csrun.pytorch.utils.tensorboard.SummaryWriter` that
``cstorch.summarize_scalar`` / ``summarize_tensor`` write through (at its ``base_step`` plus
the step, 1-based, minus one). ``activation_steps`` (how often the system fetched outputs:
csrun has every step's) and ``micro_batch_size`` (:data:`MbsSetting`: the system's tiling of
a batch, which changes its speed, not its numbers: csrun runs the whole batch) are accepted;
``listeners`` must be empty (tensor listeners are the system's debugging hooks).
:attr:`DataExecutor.step` (also :attr:`~DataExecutor.user_iteration`) is the 1-based number
of the current step, :attr:`~DataExecutor.on_final_iteration` is True on the last one, and
:attr:`~DataExecutor.profiler` ``.rate_tracker`` counts the samples of the steps begun. A loop
left with ``break`` after a whole step ends the run as if it were done (the last step's
closures run); left mid-step (an error in the loop's body) it ends as a failed session.
The session's mode follows the compiled model: ``model.eval()`` before the loop makes it an
eval run (forward only).

:func:`current_executor` is the executor whose loop is running (None outside one).
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Literal, Union

import torch

import csrun.torch as cbtorch
from csrun.cluster import cluster_info
from csrun.errors import UserError
from csrun.pytorch.backends import require_backend
from csrun.pytorch.input_worker import assign_input
from csrun.pytorch.utils.config import CSConfig
from csrun.pytorch.utils.tracker import RateTracker

MbsSetting = Union[None, int, Literal["auto", "explore", "disable"]]
"""``micro_batch_size``: the system's tiling of a batch (None, a size, ``"auto"``, ``"explore"``, ``"disable"``)."""


class ExecutorError(UserError):
    """A DataLoader / DataExecutor used in a way csrun cannot run."""


class DataLoader:
    """The 2.x input: ``DataLoader(input_fn, *args, **kwargs)``; ``input_fn(*args, **kwargs)`` returns
    a ``torch.utils.data.DataLoader``."""

    def __init__(self, input_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        if not callable(input_fn):
            raise ExecutorError(f"cstorch.utils.data.DataLoader needs the function that builds the torch DataLoader, "
                                f"got {type(input_fn).__name__}")
        self.input_fn = input_fn
        self.args = args
        self.kwargs = kwargs
        self._streaming: cbtorch.StreamingDataLoader | None = None
        self.rng_state: torch.Tensor | None = None
        """torch's random state just before ``input_fn`` ran here (None before)."""

    def streaming(self) -> cbtorch.StreamingDataLoader:
        """The loader ``input_fn`` built, wrapped by ``cbtorch.dataloader`` (built on first use)."""
        if self._streaming is None:
            self.rng_state = torch.get_rng_state()  # what a streamer building the same loader starts from
            loader = self.input_fn(*self.args, **self.kwargs)
            if not isinstance(loader, torch.utils.data.DataLoader):
                name = getattr(self.input_fn, "__name__", repr(self.input_fn))
                raise ExecutorError(f"{name}() returned {type(loader).__name__}: the input function must return a "
                                    f"torch.utils.data.DataLoader")
            self._streaming = cbtorch.dataloader(loader)
        return self._streaming

    def __len__(self) -> int:
        return len(self.streaming())

    @property
    def batch_size(self) -> int | None:
        """The torch loader's ``batch_size`` (None for a loader without one)."""
        return self.streaming().loader.batch_size

    @property
    def is_restartable(self) -> bool:
        """False: the data position of a resumed run is csrun's (the checkpoint's global step), not the loader's."""
        return False

    def state_dict(self) -> dict[str, Any]:
        """Empty (see :attr:`is_restartable`)."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Accepts the empty state of :meth:`state_dict`; a loader's own state is refused."""
        if state_dict:
            raise ExecutorError(f"DataLoader.load_state_dict({sorted(state_dict)}): csrun resumes the input at the "
                                f"checkpoint's global step; leave the dataloader out of load_checkpoint_states")

    def __iter__(self) -> Iterator[Any]:
        raise ExecutorError("iterate a cstorch.utils.data.DataExecutor(dataloader), not the DataLoader: the "
                            "executor runs the steps")


_running: "DataExecutor | None" = None


def current_executor() -> "DataExecutor | None":
    """The executor whose loop is running (None outside ``for batch in executor``)."""
    return _running


def _positive(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ExecutorError(f"DataExecutor({name}={value!r}): give a positive number of steps or None")
    return value


class Profiler:
    """``executor.profiler``: the executor's :class:`~csrun.pytorch.utils.tracker.RateTracker`."""

    def __init__(self) -> None:
        self.rate_tracker = RateTracker()
        """Samples of the steps begun, over time."""


class DataExecutor:
    """Runs the training loop's steps over a :class:`DataLoader` (see the module manual)."""

    def __init__(self, dataloader: DataLoader, num_steps: int | None = None, checkpoint_steps: int | None = None,
                 activation_steps: int | None = None, cs_config: CSConfig | None = None, writer: Any = None,
                 listeners: Any = None, micro_batch_size: MbsSetting = None) -> None:
        if not isinstance(dataloader, DataLoader):
            raise ExecutorError(f"DataExecutor needs a cstorch.utils.data.DataLoader(input_fn), got "
                                f"{type(dataloader).__name__}")
        if cs_config is not None and not isinstance(cs_config, CSConfig):
            raise ExecutorError(f"DataExecutor(cs_config=...) needs a cstorch.utils.CSConfig, got "
                                f"{type(cs_config).__name__}")
        self.dataloader = dataloader
        self.num_steps = _positive("num_steps", num_steps)
        """Steps to run (None: one pass over the loader)."""
        self.checkpoint_steps = _positive("checkpoint_steps", checkpoint_steps)
        """Checkpoint every so many steps (None: never)."""
        self.activation_steps = _positive("activation_steps", activation_steps)
        """Accepted (csrun fetches every step's values)."""
        if listeners:
            raise ExecutorError(f"DataExecutor(listeners=[{len(list(listeners))} listener(s)]): tensor listeners are "
                                f"the system's debugging hooks; read values in a cstorch.step_closure instead")
        if not (micro_batch_size is None or micro_batch_size in ("auto", "explore", "disable")
                or (isinstance(micro_batch_size, int) and not isinstance(micro_batch_size, bool)
                    and micro_batch_size > 0)):
            raise ExecutorError(f"DataExecutor(micro_batch_size={micro_batch_size!r}): give None, a positive size, "
                                f"'auto', 'explore' or 'disable'")
        self.micro_batch_size: MbsSetting = micro_batch_size
        """Accepted (csrun runs the whole batch)."""
        self.writer = writer
        """Where ``cstorch.summarize_scalar`` writes (None: nowhere)."""
        self.profiler = Profiler()
        """``profiler.rate_tracker``: samples over time."""
        self.cs_config = cs_config if cs_config is not None else CSConfig()
        self.cs_config.check()  # the job's systems and streamers are checked when the loop starts on the device
        self._systems = 1
        self.step = 0
        """The current step, 1-based (0 before the loop)."""
        self.batch: Any = None
        """The current step's batch (as the step receives it)."""
        self.total_steps: int | None = None
        """Steps this loop runs (known when it starts; None for a loader without a length)."""
        self._traced = False

    @property
    def user_iteration(self) -> int:
        """The current step, 1-based (as :attr:`step`)."""
        return self.step

    @property
    def on_final_iteration(self) -> bool:
        """True on the last step of the loop (when the number of steps is known)."""
        return self.total_steps is not None and self.step == self.total_steps

    @property
    def on_checkpoint_step(self) -> bool:
        """True on every ``checkpoint_steps``-th step and on the last step (never without checkpoint_steps)."""
        every = self.checkpoint_steps
        if not every or self.step < 1:
            return False
        return self.step % every == 0 or self.step == self.total_steps

    def begin_traced_step(self) -> Any:
        """The traced step starts on the current batch (once per batch); returns the batch."""
        if _running is not self:
            raise ExecutorError("the traced step runs inside `for batch in executor:` (a cstorch.utils.data."
                                "DataExecutor)")
        if self._traced:
            raise ExecutorError(f"the traced step was called twice in step {self.step}: call it once per batch")
        self._traced = True
        return self.batch

    def __iter__(self) -> Iterator[Any]:
        global _running
        backend = require_backend("DataExecutor")
        model = backend.model
        mode = "eval" if model is not None and not model.training else "train"
        source = self.dataloader
        assign_input(source.input_fn, source.args, source.kwargs, mode, source.rng_state)  # 2.x streamers' role
        loader = self.dataloader.streaming()
        if backend.is_csx:
            self.cs_config.check(num_streamers=cbtorch.num_streamers(), num_systems=cluster_info().num_csx)
        else:  # the CPU trains what the script's loader gives, whatever the system's num_csx
            self.cs_config.check(num_streamers=cbtorch.num_streamers())
        self._systems = cluster_info().num_csx if backend.is_csx else 1  # a step takes one batch per system
        total = self.num_steps
        if total is None:
            try:
                total = len(loader) // self._systems
            except TypeError:
                total = None
        self.total_steps = total
        self.step = 0
        if _running is not None:
            raise ExecutorError("executor loops do not nest: finish the running one first")
        session = cbtorch.Session(loader, mode=mode)
        session.__enter__()  # a streamer streams here and exits 0
        _running = self
        try:
            yield from self._steps(loader, total)
        except GeneratorExit:  # the loop was left (break, or an error in its body): end the run
            _running = None
            try:
                session.__exit__(None, None, None)  # a break after a whole step: as if done
            except Exception as exc:  # noqa: BLE001 - left mid-step: the loop's own error is on its way
                session.__exit__(type(exc), exc, exc.__traceback__)
            return
        except BaseException as exc:
            _running = None
            session.__exit__(type(exc), exc, exc.__traceback__)
            raise
        _running = None
        session.__exit__(None, None, None)

    def _steps(self, loader: cbtorch.StreamingDataLoader, total: int | None) -> Iterator[Any]:
        while total is None or self.step < total:
            produced = False
            for batch in loader:
                produced = True
                self.step += 1
                self.batch, self._traced = batch, False
                self.profiler.rate_tracker.add(_batch_size(batch) * self._systems)
                yield batch
                if total is not None and self.step >= total:
                    return
            if not produced:
                if self.step == 0:
                    raise ExecutorError("the DataLoader produced no batches (is the dataset smaller than a batch "
                                        "with drop_last=True?)")
                return
            if self.num_steps is None:
                return


def _batch_size(batch: Any) -> int:
    """The leading size of the batch's first tensor (0 when it has none)."""
    from csrun.pytorch.utils.nest import visit_torch_tensors

    for _, tensor in visit_torch_tensors(batch):
        return int(tensor.shape[0]) if tensor.dim() else 1
    return 0


__all__ = ["DataLoader", "DataExecutor", "ExecutorError", "MbsSetting", "Profiler", "current_executor"]
