"""The two execution strategies of the system, named once.

- ``pipeline`` (:data:`PIPELINE`): the model lives on the wafer. Every layer has its own
  region of PEs holding its weights, gradients, optimizer state and the activations of the
  samples in flight; samples flow through the layers as through a pipeline. The wafer's SRAM
  bounds the model's size (seed 003: "models with up to about a billion parameters").
- ``weight_streaming`` (:data:`WEIGHT_STREAMING`): the weights, the optimizer state and the
  float32 master copies live off the wafer in MemoryX; each layer's weights stream onto the
  wafer when it runs (forward, then again in reverse for the backward), its gradients stream
  out and MemoryX runs the optimizer update. Only one layer (group) and one batch's
  activations are resident at once, so models larger than the wafer train (seeds 001, 003).

The strategy changes the compiler's placement, fit rule and estimates, never the numerics: the
emulator runs the same program either way (float32 runs give identical losses).

Who selects it, later winning: the params ``runconfig.execution_strategy`` key, the environment
variable :data:`EXECUTION_STRATEGY_ENV` (``CSRUN_EXECUTION_STRATEGY``, which ``python-ws`` sets to
``weight_streaming`` for the command it runs), run.py's ``--execution_strategy`` flag.

This module imports nothing heavy: launchers (``python-ws``) read it without torch.
"""

from __future__ import annotations

from csrun.env_settings import env_name

from typing import Literal

PIPELINE = "pipeline"
"""Pipelined execution: everything resident on the wafer (the default)."""
WEIGHT_STREAMING = "weight_streaming"
"""Weight-streaming execution: weights in MemoryX, streamed in one layer (group) at a time."""
EXECUTION_STRATEGIES: tuple[str, ...] = (PIPELINE, WEIGHT_STREAMING)
"""Every valid ``execution_strategy`` value."""
ExecutionStrategy = Literal["pipeline", "weight_streaming"]
"""The type of an ``execution_strategy`` value."""
EXECUTION_STRATEGY_ENV = env_name("execution_strategy")
"""Environment variable run.py reads when ``--execution_strategy`` is not given (``python-ws``
sets it to ``weight_streaming``); it overrides ``runconfig.execution_strategy``."""
