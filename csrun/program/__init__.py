"""The device contract's home: what a training program means, defined once.

Everything that the compiler writes and the emulator reads about *training semantics* lives
here, below both of them (see ARCHITECTURE.md and tests/test_layering.py):

- ``csrun.program.archive`` — the one reader of program archives (``program.pt2``), used by
  the compile cache and the emulator server alike. An archive is data: nothing in it is
  unpickled and no string in it is executed.
- ``csrun.program.optimizers`` — the optimizer table (names, hyper-parameters, defaults),
  the learning-rate schedules and the loss-scaling defaults, with the one translation from
  the typed ``OptimizerConfig`` to the spec the compiler writes and the emulator runs.

Import the submodules directly; this package's ``__init__`` imports nothing so that the
floors above can take only what they use.
"""
