"""The program spec, re-exported: it lives in :mod:`csrun.program.spec` (the device contract, below
the compiler and the emulator). Existing ``from csrun.compiler.spec import ...`` keeps working."""

from csrun.program.spec import PRECISIONS, LossScalingSpec, OptimizerSpec, ProgramSpec, TensorSpec

__all__ = ["PRECISIONS", "LossScalingSpec", "OptimizerSpec", "ProgramSpec", "TensorSpec"]
