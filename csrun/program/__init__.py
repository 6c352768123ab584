"""The device contract's home: what a training program means, defined once.

Everything that the compiler writes and the emulator reads about *training semantics* lives
here, below both of them (see ARCHITECTURE.md and tests/test_layering.py):

- ``csrun.program.archive`` — the one reader of program archives (``program.pt2``), used by
  the compile cache and the emulator server alike. An archive is data: nothing in it is
  unpickled and no string in it is executed.
- ``csrun.program.spec`` — the :class:`ProgramSpec` (everything but the graph: inputs,
  optimizer, learning rate, precision, loss scaling, clipping), JSON, hashed by the compile cache;
  ``csrun.compiler.spec`` re-exports it.
- ``csrun.program.optimizers`` — the optimizer table: each type's name, class, update keys and
  defaults (eps, betas, ...), the legacy-key mapping (``beta1``/``beta2`` -> ``betas``, ...) and
  the one translation from a params ``optimizer:`` section to the spec's hyperparameters, so
  that ``params_train.yaml``, the compiled spec and the engine's optimizer agree.
- ``csrun.program.optimizer_config`` — :class:`OptimizerConfig`, the params ``optimizer:``
  section as a typed dataclass: the one reader of that section (run.py's params and the
  compiler's dict API both read through it).
- ``csrun.program.loss_scaling`` — dynamic loss scaling's defaults (params, spec, engine and
  ``cbtorch.amp`` read them).
- ``csrun.program.schedules`` — the LR schedules: the legacy ``learning_rate`` value as a pure
  function of the global step (the engine runs it; params, the runner, ``cbtorch`` and
  ``cstorch`` check and show it).
- ``csrun.program.errors`` — :class:`SpecError`, a spec value that cannot run.
- ``csrun.program.execution`` — the two execution strategies.

Import the submodules directly; this package's ``__init__`` imports nothing so that the
floors above can take only what they use.
"""
