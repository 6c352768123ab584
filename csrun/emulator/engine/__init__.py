"""The numerics of a step: the engine and the pieces it runs.

- :mod:`~csrun.emulator.engine.executor`: :class:`Engine` executes one program (forward via the
  captured graph, backward, optimizer, LR schedule, loss scaling, clipping) with every state
  resident on one torch device;
- :mod:`~csrun.emulator.engine.traced_forward`: the forward as a checked TorchScript trace
  (its ops run without the GIL in between), run by :mod:`~csrun.emulator.engine.torchscript`'s
  plain interpreter;
- :mod:`~csrun.emulator.engine.precision`, :mod:`~csrun.emulator.engine.half_emulation`: the
  compute precision, and 16-bit compute emulated on float32 kernels;
- :mod:`~csrun.emulator.engine.loss_scaling`: loss scaling and clipping between backward and
  the update; :mod:`~csrun.emulator.engine.lean_step`: the update without ``torch.optim``'s
  per-step wrappers where that changes nothing;
- :mod:`~csrun.emulator.engine.update_split`: a program cut at the update, for the values a
  step computes after ``optimizer.step()``;
- :mod:`~csrun.emulator.engine.compiled_step`: the whole training step (forward to update) as
  one compiled graph over the resident weights and state (``CSRUN_COMPILED_STEP``);
- :mod:`~csrun.emulator.engine.cuda_graph`: on a CUDA device, the step's forward and backward
  captured once and replayed as a CUDA graph; :mod:`~csrun.emulator.engine.graph_check`, what a
  graph cannot hold.

Nothing here knows about sockets or the user API; the device API (:mod:`csrun.emulator`) runs it.
"""
