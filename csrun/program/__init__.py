"""The device contract's home: what a training program means, defined once.

Everything that the compiler writes and the emulator reads about *training semantics* lives
here, below both of them (see ARCHITECTURE.md and tests/test_layering.py):

- ``csrun.program.archive`` — the one reader of program archives (``program.pt2``), used by
  the compile cache and the emulator server alike. An archive is data: nothing in it is
  unpickled and no string in it is executed.
- ``csrun.program.optimizers`` — each optimizer type's update keys and default epsilon, so
  that ``params_train.yaml``, the compiled spec and the engine's optimizer agree.
- ``csrun.program.loss_scaling`` — dynamic loss scaling's defaults (params, spec, engine and
  ``cbtorch.amp`` read them).

Still elsewhere (issue 9): the optimizer name list and the legacy-key translation
(``compiler/spec.py``, ``compiler/optim.py``, ``emulator/optimizers.py``) and the LR schedules
(``emulator/schedules.py``).

Import the submodules directly; this package's ``__init__`` imports nothing so that the
floors above can take only what they use.
"""
