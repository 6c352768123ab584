"""The chief's train and eval loops, written the legacy way against ``csrun.torch``.

Train: ``zero_grad``, ``outputs = model(batch)``, ``outputs["loss"].backward()``,
``optimizer.step()``, then, on the steps that need it, a step closure that reads the step's
outputs (CPU tensors, on either path) and does the bookkeeping at the step boundary, in
this order: loss check (``check_loss_values``: "NaN loss detected." / "inf loss detected.",
exit 1, no checkpoint of the bad step), ``losses.csv``, log line / TensorBoard at
``log_steps``, checkpoint at ``checkpoint_steps`` and at the last step, then a pending
preemption (checkpoint, stop). A closure makes the chief wait for that step's outputs, so
the device can run ahead only between them: closures are added at log, checkpoint and last
steps and once a preemption signal arrived. With ``save_losses`` every step's loss goes to
``losses.csv``: the loop keeps each step's loss (a device value on the system) and hands the
ones not read yet to the next closure, adding one after at most ``LOSS_READ_EVERY`` (10) steps,
so the chief waits for the device once per group instead of once per step (a closure every
step cost the README's fc_mnist job part of its steady rate: BENCHMARKS.md). A group keeps its steps' outputs
alive, so it is used only when the first step's outputs (read by a closure at step 1) are at
most ``LOSS_GROUP_MAX_OUTPUT_BYTES`` (1 MiB); a model handing back larger ones (logits) is
read every step as before. The loss is checked where it is
read, in step order, always before a checkpoint is written: a NaN loss stops the run at the
end of its group (at most 9 steps later; rows up to the step before it are written), with no
checkpoint of the bad step or after it. A run that fails otherwise loses the unread rows of
its last group.
With ``grad_accum_steps`` k > 1 (CPU only) a step is k batches with the loss divided by k;
its closure sees the last batch's outputs.

A checkpoint's ``data_position`` is the stream's batch the step after it starts at
(:func:`next_step_start`), which a resumed run skips to. On a cluster of N systems a step takes N
consecutive batches and an epoch's last batches that do not fill one are left out
(:mod:`csrun.driver.cluster_steps`): after the epoch's last full step the next one starts at the next
epoch's first batch, and that is the position recorded when the loader knows its epoch's length
(``epoch_batches``). A loader that does not (an IterableDataset, a ``batch_sampler`` that shards
itself) records the batches taken; resumed there, the run's first pass is the left-out batches
alone, which the cluster reads and leaves out again: a resumed run's first pass may hold no step
(any other pass without one is "the train loader produced no batch", exit 2). Either way a resumed
run takes the batches the uninterrupted run took, from every checkpoint (a checkpoint written
before positions were recorded this way resumes as one of an unknown length does).

Eval: one Session of one or more passes (``eval_all``: one per checkpoint, its weights
loaded before the pass); a pass is ``eval_steps`` batches or one epoch of the eval loader.
``model(batch)`` under ``torch.no_grad`` (CPU path), one closure per batch reading its
outputs. The result is the mean of each output over the batches, weighted by the batch's
``num_samples`` output when the model returns one (a padded eval split), and the samples
scored.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.utils._pytree as pytree

import csrun.torch as cbtorch
from csrun.errors import UserError
from csrun.run.checkpoints import prune_checkpoints, save_checkpoint
from csrun.run.preemption import Preempted, Preemption
from csrun.run.progress import Progress, log_line
from csrun.run.summaries import LossLog, Scalars

MSG_SAVED = "Saved checkpoint at global step: {}"
LOSS_READ_EVERY = 10
"""With ``save_losses``, the loss rows are read (and checked) in groups of at most this many steps."""
LOSS_GROUP_MAX_OUTPUT_BYTES = 1 << 20
"""Grouped only when a step's outputs (all of them, which a group keeps alive) are at most this size."""


class LossValueError(UserError):
    """The loss became NaN or inf (``check_loss_values``)."""

    exit_code = 1


def _scalar(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        return float(value.detach().float().reshape(-1)[0]) if value.numel() else float("nan")
    return float(value)


@dataclass(kw_only=True)
class TrainSetup:
    """What the train loop needs (built by the runner)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loader: Any
    """The ``cbtorch.dataloader`` (already ``skip()``-ed to the data position)."""
    model_dir: Path
    start_step: int
    target_step: int
    batch_size: int
    grad_accum_steps: int = 1
    num_csx: int = 1
    """Systems of the cluster: each step takes this many batches of ``batch_size`` (one per system)."""
    log_steps: int
    checkpoint_steps: int = 0
    check_loss_values: bool = True
    schedule: Callable[[int], float] | None = None
    """The learning-rate schedule (global step before the update -> lr), for the log."""
    scalars: Scalars
    losses: LossLog | None = None
    progress: Progress
    preemption: Preemption
    log: Callable[[str], None]
    on_cpu: bool = True
    last_saved: int | None = None
    """The step of the newest checkpoint already on disk (not saved again)."""
    keep_checkpoint_max: int = 0
    """Keep only this many newest checkpoints (0: all); the one just written and those of
    ``keep_steps`` are never deleted."""
    keep_steps: tuple[int, ...] = ()
    """Checkpoint steps retention never deletes (the one a run resumed from)."""
    epoch_batches: int | None = None
    """Batches of the stream in one epoch, when the loader knows it exactly (the data position's rule)."""


@dataclass(kw_only=True)
class TrainResult:
    """What the train loop did."""

    step: int
    stats: Any
    total_time: float
    steps_run: int
    samples: int
    final_loss: float | None = None
    """The last step's loss that was read (None: no step ran)."""


class _StepBook:
    """The step closure's state."""

    def __init__(self, s: TrainSetup) -> None:
        self.s = s
        self.last_time = time.perf_counter()
        self.last_step = s.start_step
        self.last_loss: float | None = None
        self.rate: float | None = None
        self.group: int | None = None
        """Loss rows read per closure; None (read each) until the first closure has seen the outputs' size."""

    def save(self, step: int, position: int | None = None) -> None:
        """Checkpoint ``step``; ``position``: the stream's batch after it (default: the loader's now)."""
        s = self.s
        if s.last_saved == step:
            return
        state = dict(cbtorch.get_state())
        state["lr_scheduler"] = {"global_step": int(state.get("global_step", step))}
        taken = s.loader.data_position if position is None else position
        state["data_position"] = next_step_start(taken, epoch_batches=s.epoch_batches, batches_per_step=s.num_csx)
        save_checkpoint(s.model_dir, step, state)
        s.last_saved = step
        s.log(MSG_SAVED.format(step))
        if s.keep_checkpoint_max:
            prune_checkpoints(s.model_dir, s.keep_checkpoint_max, protect=(step, *s.keep_steps))

    def wants(self, step: int, unread: int) -> bool:
        """Whether step ``step`` needs its outputs read (a closure makes the chief wait for the device):
        a log, checkpoint or last step, a pending preemption, or ``unread`` loss rows making a group."""
        s = self.s
        return (unread >= (self.group or 1) or step % s.log_steps == 0 or step == s.target_step
                or bool(s.checkpoint_steps and step % s.checkpoint_steps == 0) or s.preemption.requested)

    def check(self, loss: float) -> None:
        """``check_loss_values``: a NaN or inf loss ends the run (exit 1)."""
        if self.s.check_loss_values and not math.isfinite(loss):
            raise LossValueError("NaN loss detected." if math.isnan(loss) else "inf loss detected.")

    def on_step(self, outputs: dict[str, Any], step: int, rows: list[tuple[int, Any]], position: int) -> None:
        """The closure of a step whose outputs are read: ``rows`` are the ``save_losses`` rows since
        the last one (this step's last), each checked before it is written; ``position``: the
        stream's batch after this step (the closure runs once the next step's batches are taken)."""
        s = self.s
        for row_step, row_loss in rows:
            value = _scalar(row_loss)
            self.check(value)
            if s.losses is not None:
                s.losses.add(row_step, value)
        loss = _scalar(outputs["loss"])  # this step's: also the last row when there are rows
        self.last_loss = loss
        if not rows:
            self.check(loss)
        if self.group is None:  # a group holds its steps' outputs alive: only small ones are grouped
            held = sum(t.numel() * t.element_size() for t in pytree.tree_leaves(outputs) if isinstance(t, torch.Tensor))
            self.group = LOSS_READ_EVERY if held <= LOSS_GROUP_MAX_OUTPUT_BYTES else 1
        if step % s.log_steps == 0 or step == s.target_step:
            now = time.perf_counter()
            dt = now - self.last_time
            self.rate = (step - self.last_step) * s.batch_size * s.grad_accum_steps * s.num_csx / dt if dt > 0 else None
            self.last_time, self.last_step = now, step
            lr = s.schedule(step - 1) if s.schedule is not None else None
            if step % s.log_steps == 0:
                s.scalars.add("loss", loss, step)
                if lr is not None:
                    s.scalars.add("learning_rate", lr, step)
                if self.rate is not None:
                    s.scalars.add("samples_per_sec", self.rate, step)
                if "loss_scale" in outputs:
                    s.scalars.add("loss_scale", _scalar(outputs["loss_scale"]), step)
                s.scalars.flush()
                if s.losses is not None:
                    s.losses.flush()
                elapsed, eta = s.progress.timing(step)
                s.progress.log(log_line(step, s.target_step, loss, lr, self.rate or 0.0, elapsed=elapsed, eta=eta))
        s.progress.step(step, loss, self.rate)
        if step == s.target_step or (s.checkpoint_steps and step % s.checkpoint_steps == 0):
            self.save(step, position)
        if s.preemption.requested:
            self.save(step, position)
            raise Preempted(s.preemption.signum or 15, step)


def train(s: TrainSetup) -> TrainResult:
    """Run steps ``start_step+1 .. target_step`` in one Session; return what happened."""
    book = _StepBook(s)
    step = s.start_step
    micro = 0
    unread: list[tuple[int, Any]] = []  # save_losses rows of the steps since the last closure
    session = cbtorch.Session(s.loader, mode="train")
    t0 = time.perf_counter()
    first_pass = True
    try:
        with session:
            t0 = time.perf_counter()
            while step < s.target_step:
                took_any = False
                for batch in s.loader:
                    took_any = True
                    if micro == 0:
                        s.optimizer.zero_grad()
                    outputs = s.model(batch)
                    _check_outputs(outputs)
                    loss = outputs["loss"]
                    (loss / s.grad_accum_steps if s.grad_accum_steps > 1 else loss).backward()
                    micro += 1
                    if micro < s.grad_accum_steps:
                        continue
                    micro = 0
                    s.optimizer.step()
                    step += 1
                    if s.losses is not None:
                        unread.append((step, outputs["loss"]))
                    if book.wants(step, len(unread)):
                        cbtorch.add_step_closure(book.on_step, args=(outputs, step, unread, s.loader.data_position))
                        unread = []
                    if step >= s.target_step:
                        break
                if not took_any and not (first_pass and s.start_step):  # resumed in a cluster's left-out batches
                    raise UserError("the train loader produced no batch")
                first_pass = False
    finally:
        total = time.perf_counter() - t0
        s.progress.close()
        s.scalars.flush()
        if s.losses is not None:
            s.losses.flush()
    steps_run = step - s.start_step
    return TrainResult(step=step, stats=session.stats, total_time=total, steps_run=steps_run,
                       samples=steps_run * s.batch_size * s.grad_accum_steps * s.num_csx, final_loss=book.last_loss)


def next_step_start(taken: int, *, epoch_batches: int | None, batches_per_step: int) -> int:
    """The stream's batch the next step starts at after ``taken`` batches: ``taken``, or the next
    epoch's first batch when fewer than ``batches_per_step`` are left in this epoch of
    ``epoch_batches`` (None: not known, ``taken`` as it is)."""
    if not epoch_batches or batches_per_step <= 1:
        return taken
    epoch, within = divmod(taken, epoch_batches)
    return taken if within + batches_per_step <= epoch_batches else (epoch + 1) * epoch_batches


def _check_outputs(outputs: Any) -> None:
    if not isinstance(outputs, dict) or "loss" not in outputs:
        got = sorted(outputs) if isinstance(outputs, dict) else type(outputs).__name__
        raise UserError(f"the model's forward(batch) must return a dict of scalar tensors with 'loss' first; got {got}")


NUM_SAMPLES = "num_samples"
"""An eval output that says how many of the batch's samples are real (the rest padding)."""


@dataclass(kw_only=True)
class EvalResult:
    """Means of every output over the eval batches (one pass: one checkpoint)."""

    means: dict[str, float]
    batches: int
    stats: Any
    """The session's input figures (set on the results once the session ends)."""
    total_time: float
    samples: int
    """Samples scored: ``num_samples`` summed when the model returns it, else batches x batch_size."""
    step: int = 0
    """The global step of the weights evaluated."""


@dataclass
class _Sums:
    """Every batch's outputs, read at its step boundary."""

    batch_size: int
    rows: list[tuple[float | None, dict[str, float]]] = field(default_factory=list)

    def add(self, outputs: dict[str, Any]) -> None:
        values = {k: _scalar(v) for k, v in outputs.items()}
        self.rows.append((values.pop(NUM_SAMPLES, None), values))

    def result(self) -> tuple[dict[str, float], int]:
        """(means, samples scored). With ``num_samples`` every output is weighted by it (a batch
        of padding only counts for nothing); without it every batch weighs the same."""
        if not any(n is not None for n, _ in self.rows):
            totals: dict[str, float] = {}
            for _, values in self.rows:
                for k, v in values.items():
                    totals[k] = totals.get(k, 0.0) + v
            return {k: v / len(self.rows) for k, v in totals.items()}, len(self.rows) * self.batch_size
        weighted: dict[str, float] = {}
        samples = 0.0
        for n, values in self.rows:
            w = float(self.batch_size if n is None else n)
            if w <= 0:
                continue
            samples += w
            for k, v in values.items():
                weighted[k] = weighted.get(k, 0.0) + v * w
        if samples <= 0:
            raise UserError("the eval data held no sample (every batch reported num_samples 0)")
        return {k: v / samples for k, v in weighted.items()}, int(round(samples))


@dataclass(kw_only=True)
class EvalPass:
    """One pass of an eval session: the weights to load first (None: as they are) and their global step."""

    step: int
    load: Callable[[], bool] | None = None
    """Loads the pass's weights; False: they could not be loaded, the pass is skipped."""


def evaluate(model: torch.nn.Module, loader: Any, *, eval_steps: int | None, batch_size: int, on_cpu: bool,
             passes: list[EvalPass] | None = None,
             on_result: Callable[[EvalResult], None] | None = None) -> list[EvalResult]:
    """One Session over ``loader``; for each pass (default: one, with the weights as they are):
    load its weights, then run ``eval_steps`` batches or one whole epoch of the loader.

    The passes score the same batches: when another pass follows, a pass cut short by
    ``eval_steps`` reads the rest of its epoch without scoring it (on the CPU without running it;
    the device runs every batch of a session through its compiled step, so there it runs, unread). ``on_result`` gets each pass's
    result as soon as it is known (its outputs read); ``stats`` is filled in at the end."""
    passes = passes if passes is not None else [EvalPass(step=0)]
    session = cbtorch.Session(loader, mode="eval")
    results: list[EvalResult] = []
    with session, torch.no_grad() if on_cpu else contextlib.nullcontext():
        for i, p in enumerate(passes):
            if p.load is not None and not p.load():
                continue
            more = i + 1 < len(passes)
            sums = _Sums(batch_size)
            n = 0
            t0 = time.perf_counter()
            for batch in loader:
                if eval_steps is not None and n >= eval_steps:  # only when another pass follows
                    if not on_cpu:  # the device runs the step it compiled on every batch: run it, unread
                        _check_outputs(model(batch))
                    continue  # the next pass starts at the epoch's first batch too
                outputs = model(batch)
                _check_outputs(outputs)
                cbtorch.add_step_closure(sums.add, args=(outputs,))
                n += 1
                if eval_steps is not None and n >= eval_steps and not more:
                    break  # before the next batch is taken: a taken batch is a step begun
            session.mark_step()  # the pass's last step runs and its outputs are read before new weights load
            if not sums.rows:
                raise UserError("the eval loader produced no batch")
            means, samples = sums.result()
            result = EvalResult(means=means, batches=len(sums.rows), stats=None,
                                total_time=time.perf_counter() - t0, samples=samples, step=p.step)
            results.append(result)
            if on_result is not None:
                on_result(result)
    for r in results:
        r.stats = session.stats
    return results
