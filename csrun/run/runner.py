"""``run()``: one model-zoo run, from argv to exit status (the manual is :mod:`csrun.run`)."""

from __future__ import annotations

import logging
import os
import random
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

import csrun.torch as cbtorch
from csrun.env_settings import check_environment
from csrun.cluster import cluster_info
from csrun.compiler.settings import CompileSettings, settings_from_config
from csrun.program.errors import DeviceError
from csrun.errors import EnvironmentFailure, UsageError, UserError, describe_os_error, os_error_in
from csrun.run import cli_args, loops
from csrun.files import remove_temporaries
from csrun.launch.process import ignore_late_ctrl_c
from csrun.run.model_dir_lock import model_dir_lock
from csrun.run.checkpoints import (CheckpointError, latest_valid, list_checkpoints, load_checkpoint, save_checkpoint,
                                   set_aside_earlier_run)
from csrun.consoles import time_prefix, whole_lines
from csrun.run.logs import flush_console, setup_logging
from csrun.run.params import InputConfig, ModelConfig, Params
from csrun.run.performance import performance_doc, write_performance
from csrun.run.preemption import (Preempted, Preemption, account_preemption, announce_stop, ask_to_requeue,
                                  clear_idle_preemptions, ignore_on_streamer)
from csrun.run.progress import Progress
from csrun.run.summaries import LossLog, Scalars, write_params
from csrun.run.summary import RunSummary, make_summary, render, write_summary
from csrun.typed_config import ConfigError

log = logging.getLogger("csrun.run")

MSG_TRAIN_DONE = "Training Completed Successfully!"
MSG_EVAL_DONE = "Evaluation Completed Successfully!"
EVAL_MODES = ("eval", "eval_all")
"""Modes that only evaluate (no optimizer, the eval input)."""


def _say(text: str) -> None:
    log.info(text)
    flush_console()


def set_threads(environ: Any = None) -> None:
    """Use the CPUs Slurm gave this task: ``torch.set_num_threads($SLURM_CPUS_PER_TASK)`` unless
    ``OMP_NUM_THREADS`` is set (torch otherwise takes every core of the node, and tasks sharing a
    node then fight over them)."""
    env = os.environ if environ is None else environ
    cpus = env.get("SLURM_CPUS_PER_TASK", "")
    if cpus.isdigit() and int(cpus) > 0 and not env.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(cpus))


def seed_everything(seed: int | None) -> None:
    """Seed torch, numpy and Python's random (nothing when ``seed`` is None)."""
    if seed is None:
        return
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _optimizer(params: Params, model: torch.nn.Module, settings: Any) -> torch.optim.Optimizer:
    from csrun.program.optimizer_classes import build_optimizer, preinitialize_state
    from csrun.program.schedules import build_schedule

    spec = settings.optimizer
    lr0 = float(build_schedule(settings.learning_rate)(0))
    opt = build_optimizer(spec.type, dict(spec.hyperparameters), list(model.named_parameters()), lr=lr0)
    preinitialize_state(opt)  # stateful tensors exist before the first step (the system's rule)
    return opt


def _wrap_loader(input_fn: Callable[[Params], Any] | None, params: Params, which: str) -> Any:
    if input_fn is None:
        raise ConfigError(f"this model has no {which} input function: --mode {params.runconfig.mode} is not available")
    loader = input_fn(params)
    return cbtorch.dataloader(loader)


def _checkpoint_to_load(params: Params, model_dir: Path) -> tuple[dict[str, Any] | None, str]:
    """(state, where) for this run, or (None, why not)."""
    rc = params.runconfig
    restarts = cluster_info().restart_count
    if restarts and not rc.resume:
        _say(f"this job was requeued by Slurm (restart {restarts}): resuming from the latest checkpoint in {model_dir}")
    if rc.start_over and (rc.resume or rc.checkpoint_path):
        raise ConfigError(f"--start_over sets the run in model_dir aside and trains from step 0: it does not go with "
                          f"{'--resume' if rc.resume else '--checkpoint_path'}; give one of them")
    if rc.resume or restarts:
        found = latest_valid(model_dir)
        if found is not None:
            for why in found.skipped:
                log.warning("%s; falling back to an older checkpoint", why)
            return found.state, str(found.path)
        if not rc.checkpoint_path:
            if rc.resume:  # asked to continue: starting over would train something else without a word
                raise ConfigError(f"--resume: no valid checkpoint in {model_dir} to continue from; give "
                                  f"--checkpoint_path PATH, or run without --resume to start at step 0")
            _say(f"requeued before the first checkpoint: no checkpoint in {model_dir}; starting from step 0")
            return None, ""
    if rc.checkpoint_path:
        return load_checkpoint(Path(rc.checkpoint_path)), rc.checkpoint_path
    if rc.mode == "eval":
        found = latest_valid(model_dir)
        if found is not None:
            for why in found.skipped:
                log.warning("%s; falling back to an older checkpoint", why)
            return found.state, str(found.path)
        raise ConfigError(f"--mode eval: no valid checkpoint in {model_dir} to evaluate; give --checkpoint_path PATH "
                          f"(or train into this model_dir first): random weights are never scored")
    earlier = list_checkpoints(model_dir) if rc.mode in ("train", "train_and_eval") else []
    if earlier and rc.start_over:
        _say(f"--start_over: the earlier run's checkpoints, losses and summaries moved into "
             f"{set_aside_earlier_run(model_dir)}; training from step 0")
    elif earlier:  # starting at step 0 beside them would mix two runs' checkpoints, losses and summaries
        raise ConfigError(f"model_dir {model_dir} holds an earlier run's checkpoints (up to "
                          f"{earlier[0][1].name}): continue it with --resume, start over with --start_over (its "
                          f"files are moved into model_dir/previous_run_<time>/), or train into another "
                          f"-o/--model_dir (nothing was changed)")
    return None, ""


def _target_step(params: Params, start: int, loader_len: int | None, accum: int) -> int:
    rc = params.runconfig
    if rc.num_steps is not None:
        target = start + rc.num_steps
    elif rc.num_epochs is not None:
        per_epoch = rc.steps_per_epoch or ((loader_len // accum) if loader_len else None)
        if not per_epoch:
            raise ConfigError("runconfig.num_epochs: the train loader has no length; give runconfig.steps_per_epoch")
        target = rc.num_epochs * per_epoch
    else:
        target = rc.max_steps or 0
    if rc.max_steps is not None:
        target = min(target, rc.max_steps)
    return target


def _compile_info() -> dict[str, Any]:
    info = cbtorch.compile_info()
    if info is None:
        return {}
    return {"compile_time": info.compile_time, "est_samples_per_sec": info.est_samples_per_sec,
            "programming_time": getattr(info, "programming_time", None)}


def run(*, model_fn: Callable[[Params], torch.nn.Module],
        train_input_fn: Callable[[Params], torch.utils.data.DataLoader] | None,
        eval_input_fn: Callable[[Params], torch.utils.data.DataLoader] | None,
        model_config: type[ModelConfig] = ModelConfig, input_config: type[InputConfig] = InputConfig,
        eval_metrics: Callable[[dict[str, float]], dict[str, float]] | None = None,
        argv: list[str] | None = None, default_model_dir: str | None = None,
        extra_args_parser_fn: Callable[[], Any] | None = None) -> int:
    """Run run.py's command line ``argv`` (default ``sys.argv[1:]``); return the exit status.

    ``extra_args_parser_fn``: returns an ``argparse.ArgumentParser`` (``add_help=False``), or a
    list of them, with the model's own flags; they are parsed with run.py's (an unknown flag is
    still an error) and reach ``model_fn`` and the input functions as ``params.extra_args``.

    After a Ctrl-C stopped the run, SIGINT stays ignored: the program is ending, and a person's
    next press must not turn its exit into a traceback. Each line the process prints is one write
    (:func:`~csrun.consoles.whole_lines`: a job's tasks share the launcher's stream)."""
    started = time.monotonic()
    whole_lines()
    prog = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "run.py"
    made = extra_args_parser_fn() if extra_args_parser_fn is not None else []
    parents = list(made) if isinstance(made, (list, tuple)) else [made]
    try:
        check_environment()
        args = cli_args.parse_args(argv, prog=prog, parents=parents)
    except SystemExit as exc:  # --help or --version (0)
        return exc.code if isinstance(exc.code, int) else 2
    except (UsageError, ConfigError) as exc:  # a bad flag; or the model's own parser does not fit run.py's
        print(f"{prog}: error: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    is_chief = cbtorch.is_master_ordinal()
    try:
        params = cli_args.load_params(args, model_config=model_config, input_config=input_config,
                                      default_model_dir=default_model_dir)
        path = cli_args.choose_path(params)
        cli_args.check_system_rules(params, path)
        return _run(params, path, model_fn=model_fn, train_input_fn=train_input_fn,
                    eval_input_fn=eval_input_fn, eval_metrics=eval_metrics, started=started)
    except SystemExit as exc:  # compile_only / validate_only end here
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except Preempted as exc:
        if exc.signum == signal.SIGINT:  # stopped by hand: the run is over, a second press changes nothing now
            ignore_late_ctrl_c()
        if exc.saved:
            _say(f"{exc}; checkpoint saved. Continue with --resume.")
        else:
            _say(f"{exc}, before its first step: nothing new to save. Continue with --resume.")
        ask_to_requeue(exc)
        announce_stop(exc)
        return exc.exit_code
    except UserError as exc:
        if is_chief or not isinstance(exc, ConfigError):
            where = "" if is_chief else f" (rank {cbtorch.get_ordinal()})"
            sys.stdout.flush()
            print(f"{prog}: error{where}: {exc}", file=sys.stderr, flush=True)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        ignore_late_ctrl_c()
        return 130
    except (OSError, RuntimeError) as exc:  # the machine failed (disk, permissions, a lost server)
        line = _environment_failure(exc)
        if line is None:
            raise
        where = "" if is_chief else f" (rank {cbtorch.get_ordinal()})"
        sys.stdout.flush()
        print(f"{prog}: error{where}: {line}", file=sys.stderr, flush=True)
        return 1


def _environment_failure(exc: BaseException) -> str | None:
    """One line for a failure of the machine rather than of the code: an OSError anywhere in the
    chain, or the device's link lost; None for anything else (a bug keeps its traceback)."""
    if isinstance(exc, DeviceError):
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    err = os_error_in(exc)
    return None if err is None else describe_os_error(err)


def compile_settings(params: Params, *, mode: str) -> CompileSettings:
    """The compile settings of typed params for run.py's ``mode`` (``eval_all`` compiles ``eval``)."""
    return settings_from_config(params.optimizer, mode=mode, mixed_precision=params.model.mixed_precision,
                                use_cbfloat16=params.csconfig.use_cbfloat16,
                                execution_strategy=params.runconfig.execution_strategy)


def _run(params: Params, path: cli_args.RunPath, *, model_fn: Callable[[Params], torch.nn.Module],
         train_input_fn: Callable[[Params], Any] | None, eval_input_fn: Callable[[Params], Any] | None,
         eval_metrics: Callable[[dict[str, float]], dict[str, float]] | None, started: float) -> int:
    rc = params.runconfig
    is_chief = cbtorch.is_master_ordinal()
    setup_logging(rc.logging if is_chief else rc.streamer_logging)
    mode = rc.mode
    try:
        settings = compile_settings(params, mode="eval" if mode == "eval_all" else mode)
    except UserError as exc:
        raise ConfigError(str(exc)) from None
    model_dir = Path(rc.model_dir)
    if path.kind == "system":
        compiling = rc.compile_only or rc.validate_only
        cs_ip = path.cs_ip if compiling else (path.cs_ip or "embedded")
        cbtorch.initialize(cs_ip, compile_only=rc.compile_only, validate_only=rc.validate_only, settings=settings,
                           model_dir=str(model_dir), compile_dir=rc.compile_dir,
                           queue_depth=params.csconfig.queue_depth, verify_steps=rc.verify_steps,
                           verify_every=rc.verify_every)
    else:
        cbtorch.initialize(None, settings=settings, model_dir=str(model_dir), compile_dir=rc.compile_dir,
                           backend=cbtorch.EagerBackend(settings))
    if mode == "train_and_eval" and cbtorch.num_streamers() > 0:
        raise ConfigError("--mode train_and_eval needs a lone chief (no streamers): only one Session per run "
                          "can stream; run train, then eval")
    set_threads()
    seed_everything(rc.seed)

    if not is_chief:  # streamers: stream the first session's input, then leave
        ignore_on_streamer()
        evaluating = mode in EVAL_MODES
        loader = _wrap_loader(eval_input_fn if evaluating else train_input_fn, params,
                              "eval" if evaluating else "train")
        with cbtorch.Session(loader, mode="eval" if evaluating else "train"):
            pass
        return 0

    with Preemption() as preemption:  # from here on a preemption signal is a flag, checked at step boundaries
        return _chief(params, path, settings, model_dir, preemption, model_fn=model_fn,
                      train_input_fn=train_input_fn, eval_input_fn=eval_input_fn, eval_metrics=eval_metrics,
                      started=started)


def _chief(params: Params, path: cli_args.RunPath, settings: Any, model_dir: Path, preemption: Preemption, *,
           model_fn: Callable[[Params], torch.nn.Module], train_input_fn: Callable[[Params], Any] | None,
           eval_input_fn: Callable[[Params], Any] | None,
           eval_metrics: Callable[[dict[str, float]], dict[str, float]] | None, started: float) -> int:
    rc = params.runconfig
    mode = rc.mode
    log.info("csrun: %s path (%s), mode %s, model_dir %s", path.kind, path.reason, mode, model_dir)
    _make_model_dir(model_dir)
    with model_dir_lock(model_dir):  # one job at a time in a model_dir (csrun.run.model_dir_lock)
        stale = [*remove_temporaries(model_dir), *remove_temporaries(model_dir / "losses")]
        for leftover in stale:  # a crash mid-save: nothing later trusts or keeps it
            log.warning("removed %s, left by a run that stopped while writing it", leftover)
        model = cbtorch.module(model_fn(params))
        if mode == "eval_all":
            _eval_all(params, path, model, model_dir, eval_input_fn, eval_metrics, started)
            return 0
        optimizer = cbtorch.optimizer(_optimizer(params, model, settings)) if mode != "eval" else None
        state, where = _checkpoint_to_load(params, model_dir)
        start = 0
        data_position: int | None = None  # the stream's batch the checkpoint's next step starts at
        resumed: tuple[int, ...] = ()  # the step of the checkpoint loaded: retention never deletes it
        if state is not None:
            pretrained = rc.is_pretrained_checkpoint and where == rc.checkpoint_path
            if pretrained:
                cbtorch.set_state(state, strict=False, load_optimizer=False)
                _say(f"Loaded pretrained weights from {where} (step 0, optimizer state not loaded)")
            else:
                cbtorch.set_state(state, strict=True, load_optimizer=optimizer is not None)
                start = int(state.get("global_step", 0))
                resumed = (start,)
                position = state.get("data_position")
                if isinstance(position, int) and not isinstance(position, bool) and position >= 0:
                    data_position = position
                _say(f"Loaded checkpoint {where} at global step {start}")
        if mode in ("train", "train_and_eval"):
            start = _train(params, path, model, optimizer, settings, model_dir, start, train_input_fn, preemption,
                           keep_steps=resumed, started=started, data_position=data_position)
        if mode in ("eval", "train_and_eval"):
            _eval(params, path, model, model_dir, start, eval_input_fn, eval_metrics, time.monotonic()
                  if mode == "train_and_eval" else started)
        return 0


def _make_model_dir(model_dir: Path) -> None:
    """Create model_dir, or say in one line why it cannot be (a file in the way, not writable)."""
    if model_dir.exists() and not model_dir.is_dir():
        raise EnvironmentFailure(f"model_dir {model_dir} is a file, not a folder: pass another -o/--model_dir")
    try:
        model_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EnvironmentFailure(f"cannot create model_dir {model_dir}: {describe_os_error(exc)}") from None
    if not os.access(model_dir, os.W_OK | os.X_OK):
        raise EnvironmentFailure(f"model_dir {model_dir} is not writable by this user")


def _train(params: Params, path: cli_args.RunPath, model: torch.nn.Module, optimizer: Any, settings: Any,
           model_dir: Path, start: int, train_input_fn: Callable[[Params], Any] | None,
           preemption: Preemption, *, keep_steps: tuple[int, ...] = (), started: float,
           data_position: int | None = None) -> int:
    from csrun.program.schedules import build_schedule

    rc = params.runconfig
    if params.optimizer is None or params.train_input is None:
        raise ConfigError("optimizer / train_input: required sections missing for training")
    accum = params.optimizer.grad_accum_steps
    loader = _wrap_loader(train_input_fn, params, "train")
    try:
        loader_len = len(loader)
    except TypeError:
        loader_len = None
    systems = rc.num_csx if path.kind == "system" and rc.num_csx else 1  # batches a step takes: accum x systems
    target = _target_step(params, start, loader_len // systems if loader_len else loader_len, accum)
    folder = model_dir / "train"
    write_params(folder, "train", params.to_dict())
    if start >= target:
        _say(f"global step {start} already reaches the last step {target}: nothing to train")
        _say(MSG_TRAIN_DONE)
        return start
    if start:  # the batch the checkpoint's next step starts at (loops.next_step_start; another num_csx took
        # another count a step)
        loader.skip(data_position if data_position is not None else start * accum * systems)
    schedule = build_schedule(settings.learning_rate)
    _say_schedule_end(schedule, start, target)
    scalars = Scalars(folder)
    losses = LossLog(model_dir, start) if rc.save_losses else None
    last_saved = None
    if rc.save_initial_checkpoint and start == 0 and not (rc.compile_only or rc.validate_only):
        st = dict(cbtorch.get_state())
        st["lr_scheduler"] = {"global_step": 0}
        st["data_position"] = 0
        save_checkpoint(model_dir, 0, st)
        _say(loops.MSG_SAVED.format(0))
        last_saved = 0
    progress = Progress(start=start, total=target)
    preemption.stops_at_steps = True
    try:
        if preemption.requested:  # signalled before the first step (setup, data, restore): no step gained
            raise Preempted(preemption.signum or 15, start, saved=False)
        result = loops.train(loops.TrainSetup(
            model=model, optimizer=optimizer, loader=loader, model_dir=model_dir, start_step=start,
            target_step=target, batch_size=params.train_input.batch_size, grad_accum_steps=accum, num_csx=systems,
            log_steps=rc.log_steps, checkpoint_steps=rc.checkpoint_steps,
            check_loss_values=rc.check_loss_values, schedule=schedule,
            scalars=scalars, losses=losses, progress=progress, preemption=preemption, log=_say,
            on_cpu=path.kind == "cpu", last_saved=last_saved, keep_checkpoint_max=rc.keep_checkpoint_max,
            keep_steps=keep_steps, epoch_batches=loader_len if loader.plan.batches_per_epoch is not None else None))
        clear_idle_preemptions(model_dir)
    except Preempted as exc:
        if exc.signum != signal.SIGINT:  # Ctrl-C: stopped by hand, not a fruitless preemption
            account_preemption(model_dir, start, exc)
        raise
    finally:
        preemption.stops_at_steps = False
        scalars.close()
        if losses is not None:
            losses.close()
    write_performance(model_dir, performance_doc(
        total_samples=result.samples, total_time=result.total_time, batch_size=params.train_input.batch_size,
        stats=result.stats, compile_info=_compile_info(), path=path.kind, mode="train", global_step=result.step))
    _say(MSG_TRAIN_DONE)
    newest = max(list_checkpoints(model_dir), default=None)
    _summarize(make_summary(mode="train", started=started, start_step=start, end_step=result.step,
                            samples=result.samples, total_time=result.total_time, final_loss=result.final_loss,
                            last_checkpoint=newest[1] if newest else None, tensorboard_dir=folder, model_dir=model_dir))
    return result.step


def _say_schedule_end(schedule: Callable[[int], float], start: int, target: int) -> None:
    """One warning when the learning rate reaches 0 before the last step (the steps after it would
    train nothing, without a word). Schedules stay at 0 once there: the first such step is found
    by bisection."""
    if target <= start or schedule(target - 1) != 0 or schedule(start) == 0:
        return
    low, high = start, target - 1  # schedule(low) > 0, schedule(high) == 0
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if schedule(mid) == 0 else (mid, high)
    log.warning("the learning-rate schedule reaches 0 at step %d: steps %d-%d train at lr 0, changing nothing "
                "(lengthen the schedule's decay_steps, or lower --max_steps)", high + 1, high + 1, target)


def _summarize(summary: RunSummary) -> None:
    """Print the run's summary block and write its ``summary.json`` (:mod:`csrun.run.summary`)."""
    write_summary(summary)
    flush_console()
    stamp = time_prefix(sys.stdout)
    print("\n".join(f"{stamp}{line}" for line in render(summary)), flush=True)


def _eval(params: Params, path: cli_args.RunPath, model: torch.nn.Module, model_dir: Path, step: int,
          eval_input_fn: Callable[[Params], Any] | None,
          eval_metrics: Callable[[dict[str, float]], dict[str, float]] | None, started: float) -> None:
    """Evaluate the weights as they are (loaded, or just trained) at global step ``step``."""
    _evaluate(params, path, model, model_dir, [loops.EvalPass(step=step)], eval_input_fn, eval_metrics, started)


def _eval_all(params: Params, path: cli_args.RunPath, model: torch.nn.Module, model_dir: Path,
              eval_input_fn: Callable[[Params], Any] | None,
              eval_metrics: Callable[[dict[str, float]], dict[str, float]] | None, started: float) -> None:
    """``--mode eval_all``: every checkpoint in model_dir, oldest first, in one eval session (on the
    device: one compile; each checkpoint's weights loaded between passes); one TensorBoard point
    per checkpoint at its global step. A checkpoint that does not verify is reported and skipped."""
    rc = params.runconfig
    if rc.checkpoint_path:
        raise ConfigError("--mode eval_all evaluates every checkpoint in model_dir: --checkpoint_path is for "
                          "--mode eval")
    found = sorted(list_checkpoints(model_dir))
    if not found:
        raise CheckpointError(f"--mode eval_all: no checkpoint in {model_dir} (checkpoint_<step>.mdl)")
    _say(f"eval_all: {len(found)} checkpoint(s) in {model_dir}: steps {', '.join(str(st) for st, _ in found)}")
    skipped: list[str] = []

    def loader_of(ckpt: Path) -> Callable[[], bool]:
        def load() -> bool:
            try:
                state = load_checkpoint(ckpt)
            except CheckpointError as exc:
                log.warning("%s; skipping it", exc)
                skipped.append(str(exc))
                return False
            cbtorch.set_state(state, strict=True, load_optimizer=False)
            _say(f"Loaded checkpoint {ckpt} at global step {int(state.get('global_step', 0))}")
            return True
        return load

    passes = [loops.EvalPass(step=st, load=loader_of(ckpt)) for st, ckpt in found]
    results = _evaluate(params, path, model, model_dir, passes, eval_input_fn, eval_metrics, started)
    if not results:
        raise CheckpointError(f"--mode eval_all: no valid checkpoint in {model_dir}: " + "; ".join(skipped))
    _say(f"eval_all: evaluated {len(results)} checkpoint(s)"
         + (f", skipped {len(skipped)} that did not verify" if skipped else ""))


def _evaluate(params: Params, path: cli_args.RunPath, model: torch.nn.Module, model_dir: Path,
              passes: list[loops.EvalPass], eval_input_fn: Callable[[Params], Any] | None,
              eval_metrics: Callable[[dict[str, float]], dict[str, float]] | None,
              started: float) -> list[loops.EvalResult]:
    """One eval session over ``passes``; each pass's loss and metrics logged and written to eval/ at its step."""
    rc = params.runconfig
    if params.eval_input is None:
        raise ConfigError(f"eval_input: required section missing for --mode {rc.mode}")
    loader = _wrap_loader(eval_input_fn, params, "eval")
    folder = model_dir / "eval"
    write_params(folder, "eval_all" if rc.mode == "eval_all" else "eval", params.to_dict())
    scalars = Scalars(folder)

    def report(result: loops.EvalResult) -> None:
        metrics = dict(eval_metrics(result.means)) if eval_metrics is not None else {}
        scalars.add("loss", result.means["loss"], result.step)
        for name, value in metrics.items():
            scalars.add(name, float(value), result.step)
        scalars.flush()
        _say(f"Avg Eval. Loss = {result.means['loss']:.6g}")
        for name, value in metrics.items():
            _say(f"Eval. {name} = {float(value):.6g}")
        _say(f"Scored {result.samples} eval samples ({result.batches} batches) at global step {result.step}")

    try:
        results = loops.evaluate(model, loader, eval_steps=rc.eval_steps, batch_size=params.eval_input.batch_size,
                                 on_cpu=path.kind == "cpu", passes=passes, on_result=report)
    finally:
        scalars.close()
    if results and rc.mode in EVAL_MODES:
        write_performance(model_dir, performance_doc(
            total_samples=sum(r.samples for r in results), total_time=sum(r.total_time for r in results),
            batch_size=params.eval_input.batch_size, stats=results[-1].stats, compile_info=_compile_info(),
            path=path.kind, mode=rc.mode, global_step=results[-1].step))
    if results:
        _say(MSG_EVAL_DONE)
        last = results[-1]
        _summarize(make_summary(mode="eval_all" if rc.mode == "eval_all" else "eval", started=started,
                                start_step=results[0].step, end_step=last.step, samples=sum(r.samples for r in results),
                                total_time=sum(r.total_time for r in results), final_loss=last.means.get("loss"),
                                last_checkpoint=None, tensorboard_dir=folder, model_dir=model_dir))
    return results
