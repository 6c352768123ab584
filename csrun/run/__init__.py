"""The model-zoo runner: ``models/<name>/run.py`` is a few lines calling :func:`run`.

A model's run.py::

    import sys
    from pathlib import Path
    from csrun.run import run
    from model import MyModel, MyModelConfig, MyInputConfig, metrics   # siblings of run.py
    from data import train_input_fn, eval_input_fn

    if __name__ == "__main__":
        sys.exit(run(model_fn=lambda p: MyModel(p.model), train_input_fn=train_input_fn,
                     eval_input_fn=eval_input_fn, model_config=MyModelConfig,
                     input_config=MyInputConfig, eval_metrics=metrics,
                     default_model_dir=str(Path(__file__).resolve().parent / "model_dir")))

Contract: ``model_fn(params)`` returns a ``torch.nn.Module`` whose ``forward(batch)`` returns
a dict of scalar tensors, ``"loss"`` first (others, e.g. ``"correct"``, are averaged in
eval). Input functions return a ``torch.utils.data.DataLoader`` with ``drop_last=True``
(the runner wraps it with ``cbtorch.dataloader``; map-style datasets must split evenly over
the streamers). To score a whole eval split, whose size need not be a multiple of the batch,
the eval input function pads it to whole batches (:func:`csrun.run.inputs.pad_to_whole_batches`)
and ``forward`` averages over the batch's real samples and returns their count as
``"num_samples"``: the runner then weights every eval output by it (a batch of padding only
counts for nothing) and reports the samples scored; without it every batch counts
``batch_size`` samples. fc_mnist does this (padding labelled -1). ``eval_metrics(means)``
turns the eval means into named metrics. Every task runs the same script: rank 0 (the
chief) runs the loops, the others stream input.

run.py flags (every given flag overwrites the ``runconfig`` key of the same name, then the
params are checked; each long flag also takes dashes, ``--max-steps`` for the legacy
``--max_steps``, and a misspelt one is still an error, exit 2):

=====================================  ==============================================================
``-p/--params FILE`` (required)        the params YAML (sections in :mod:`csrun.run.params`)
``-m/--mode`` (required)               ``train``, ``eval``, ``eval_all`` (every checkpoint in model_dir,
                                       see Eval below) or ``train_and_eval`` (CPU, lone chief only: on
                                       the system "Training with Eval on CS is not currently
                                       supported.")
``-cs/--cs_ip HOST[:PORT]``            the system (a ``cs_emulator`` server); ``:9000`` added when no
                                       port; default ``$CS_IP``
``-cpu/--cpu``                         force the CPU path (wins over cs_ip and csrun_wse)
``--compile_only``                     full compile at the first batch, no run (exit 0 / 1)
``--validate_only``                    capture and check only; with ``--compile_only``: "Please set
                                       one of compile_only and validate_only"
``-o/--model_dir DIR``                 output folder; default ``runconfig.model_dir``, else
                                       ``<run.py dir>/model_dir``
``--checkpoint_path FILE``             checkpoint to load (strict; optimizer and step too)
``--is_pretrained_checkpoint``         with ``--checkpoint_path``: step 0, non-strict, no optimizer state
``--resume``                           continue from the newest valid checkpoint in model_dir (a corrupt
                                       newest one is reported and the previous one used); none there:
                                       ``--checkpoint_path`` if given, else refused
``--start_over``                       train from step 0 in a model_dir an earlier run used: its
                                       checkpoints, losses, summaries and performance files are moved
                                       into ``model_dir/previous_run_<time>/`` first (nothing deleted);
                                       without it (or ``--resume``) such a model_dir is refused
``--logging LEVEL``                    chief log level (streamers: ``runconfig.streamer_logging``)
``--config KEY``                       use one top-level key of the YAML
``-c/--compile_dir DIR``               compile output folder (default ``model_dir/cs_<hash>``)
``--execution_strategy S``             ``pipeline`` (default) or ``weight_streaming`` (weights in MemoryX,
                                       streamed onto the wafer one layer group at a time; what
                                       ``python-ws`` selects through ``CSRUN_EXECUTION_STRATEGY``);
                                       flag > that variable > ``runconfig.execution_strategy``; changes
                                       the compile's plan and estimate, not the numerics
                                       (:mod:`csrun.program.execution`)
``--max_steps N``, ``--eval_steps N``  override ``runconfig.max_steps`` / ``eval_steps`` /
``--checkpoint_steps N``               ``checkpoint_steps`` (same checks; a bad value is one line
                                       naming the flag, exit 2; ``params_<mode>.yaml`` records the
                                       value that ran)
``--verify_steps N``                   ``runconfig.verify_steps``: the device checks the first N steps of
                                       each program against eager PyTorch from the same state and batch
                                       (default ``$CSRUN_VERIFY_STEPS``, else 1; 0: off;
                                       :mod:`csrun.driver.verify`)
``--verify_every K``                   ``runconfig.verify_every``: after those, one step in K is checked the
                                       same way (default ``$CSRUN_VERIFY_EVERY``, else 0: none)
``--version``                          print ``run.py (csrun X.Y.Z)``
(a model's own flags)                  ``run(..., extra_args_parser_fn=f)``: ``f()`` returns parser(s)
                                       (``add_help=False``) parsed with these; the values reach the
                                       model and input functions as ``params.extra_args`` (a dict
                                       by dest; not in ``params_<mode>.yaml``); an unknown flag is
                                       still an error listing the valid ones, and a model flag that
                                       run.py already has is a one-line error (exit 2)
=====================================  ==============================================================

Paths: the **system** when ``cs_ip``, ``--compile_only`` or ``--validate_only`` is set, or when
launched by ``csrun_wse`` (``CSRUN_LAUNCHER=csrun_wse``) without ``--cpu`` (then the emulator
runs embedded in the chief); otherwise the **CPU** (eager PyTorch with the device's schedule
and clipping). The system refuses ``train_and_eval``, and ``grad_accum_steps > 1`` when pipelined
("Gradient Accumulation not supported on CS workflow."); in weight-streaming mode it accepts it, as
the system's weight streaming did: the step's batches run as one batch that the device splits
into micro batches (:func:`csrun.run.cli_args.check_system_rules`). Environment read: ``CS_IP``,
``CSRUN_EXECUTION_STRATEGY``, ``CSRUN_LAUNCHER``
(and what :mod:`csrun.torch` and :mod:`csrun.cluster` read; the embedded emulator reads
``CSRUN_HALF_EMULATION``: ``rounding``, the CPU default, or ``autocast``, see
:mod:`csrun.emulator.engine.half_emulation`, and ``CSRUN_ENGINE_TRACE``: ``auto``, a checked trace of
the graph on a CPU, or ``off``, see :mod:`csrun.emulator.engine.traced_forward`, and
``CSRUN_CUDA_GRAPH``: ``auto``, a CUDA graph per step on a GPU, or ``off``, see
:mod:`csrun.emulator.engine.cuda_graph`; a remote one ``CSRUN_CONNECT_TIMEOUT``, seconds to keep
trying to reach ``cs_ip``, default 10, checked before the compile), ``CSRUN_PROGRESS``
(``auto``: a progress bar only on a real terminal, never into a Slurm job log; ``bar``;
``lines``: see :mod:`csrun.run.progress`).

Run length: ``max_steps`` is the last global step; ``num_steps`` runs that many steps from the
starting step (capped by max_steps); ``num_epochs`` runs to ``num_epochs * steps_per_epoch``
(default: the loader's length). ``seed`` seeds torch, numpy and random on every task.

Eval: ``eval`` scores the checkpoint of ``--checkpoint_path``, else the newest valid one in
model_dir, at its global step; ``eval_all`` scores every checkpoint in model_dir, oldest first
(one that does not verify is reported and skipped; none at all: exit 1; ``--checkpoint_path``
is refused), in one eval session (the streamers stream one epoch per checkpoint):
on the system the eval program is compiled once and each checkpoint's weights are loaded into
it; each gets one TensorBoard point at its global step, with the values ``eval`` gives for it
alone. A pass is one whole epoch of the eval loader, or its first ``eval_steps`` batches (with
``eval_all`` the rest of that epoch is read but not scored, so every checkpoint scores the same
batches; the system still runs those batches). Each pass logs "Avg Eval. Loss = X", the
metrics and "Scored N eval samples (K batches) at global step S".

What a run leaves in ``model_dir`` (chief only):

* ``checkpoint_<step>.mdl`` + ``.sha256`` (:mod:`csrun.run.checkpoints`): at ``checkpoint_steps``,
  the last step, step 0 with ``save_initial_checkpoint``, and on preemption; "Saved checkpoint at
  global step: N"; with ``runconfig.keep_checkpoint_max: N`` (default 0: keep all, as legacy) only
  the newest N stay (each deleted with its ``.sha256``), checked after every save; the one just
  written and the one a run resumed from are never deleted;
* ``train/``, ``eval/``: TensorBoard events and ``params_<mode>.yaml`` (``params_eval_all.yaml``
  for eval_all; :mod:`csrun.run.summaries`);
* ``losses/losses.csv`` with ``save_losses`` (``step,loss``, one row per step);
* ``performance/performance.json`` (:mod:`csrun.run.performance`; the last run's) and
  ``performance/<mode>/summary.json``, the figures of the summary block each mode ends with
  (:mod:`csrun.run.summary`);
* ``previous_run_<time>/``: an earlier run set aside by ``--start_over``;
* ``cs_<hash>/`` from the compile (system path).

Messages: "Training Completed Successfully!", "Avg Eval. Loss = X" and one "Eval. <metric> = X"
line per metric, "NaN loss detected." / "inf loss detected." (exit 1). Exit status: 0 done;
2 a params/flag error (one line ``run.py: error: ...``, no traceback); 1 a compile, checkpoint
or run error; 143 / 138 stopped by SIGTERM / SIGUSR1 after a checkpoint (:mod:`csrun.run.preemption`;
SIGTERM outside training stops at once, saving nothing);
130 Ctrl-C (in training: after a checkpoint at the next step; a second Ctrl-C, or one outside
training, stops at once).

Modules: :mod:`~csrun.run.cli_args` (flags, overrides, path), :mod:`~csrun.run.params` (YAML
schema), :mod:`~csrun.run.runner` (orchestration), :mod:`~csrun.run.loops` (train/eval),
:mod:`~csrun.run.checkpoints`, :mod:`~csrun.run.summaries`, :mod:`~csrun.run.performance`,
:mod:`~csrun.run.progress`, :mod:`~csrun.run.preemption`, :mod:`~csrun.run.inputs` (eval padding,
HDF5 input functions), :mod:`~csrun.run.model_size` (a model's size from its config, checked before
it is built).
"""

from __future__ import annotations

from typing import Any

from csrun.run.params import InputConfig, ModelConfig, Params

__all__ = ["run", "Params", "ModelConfig", "InputConfig"]


def __getattr__(name: str) -> Any:
    """``run`` loads lazily, and this stays on purpose: ``csrun.run.params`` (imported by the
    models' ``model.py``/``data.py`` and YAML checks) must not pull in torch, the compiler and
    the emulator through ``csrun.run.runner`` -> ``csrun.torch`` -> ``csrun.driver``."""
    if name == "run":
        from csrun.run.runner import run

        return run
    raise AttributeError(f"module 'csrun.run' has no attribute {name!r}")
