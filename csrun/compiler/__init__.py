"""The compiler: capture, static-graph checks, wafer placement and fit, compile dir and cache.

Entry points (import from here):

- :func:`validate_only`, :func:`compile_only` -> :class:`CompileResult`; :func:`exit_code`;
- :func:`load_program` (read as data, :mod:`csrun.program.archive`) -> ``(ExportedProgram, ProgramSpec)``;
  a saved program's weights are shape-only placeholders: :func:`bind_weights` gives them
  values (``model.state_dict()`` or a checkpoint's), :func:`has_weight_values` tells;
- :class:`CompileSettings`, :func:`settings_from_config` (the typed params),
  :func:`settings_from_params` (a params mapping);
- :func:`optimizer_spec_from_torch`, :func:`optimizer_spec_from_config`, :func:`optimizer_spec_from_params`;
- :func:`check_compile_flags` (``--compile_only`` with ``--validate_only``), :func:`check_batch`,
  :func:`check_dataloader`;
- :class:`WaferSpec`, :data:`WSE2`, :class:`MemoryXSpec`, :data:`MEMORYX`; the errors in :mod:`csrun.compiler.errors`;
- :func:`plan_program` (the plan in the settings' execution strategy: pipelined,
  :mod:`csrun.compiler.placement`, or weight streaming, :func:`place_streaming` in
  :mod:`csrun.compiler.streaming`).

The program spec lives in :mod:`csrun.program.spec` (``csrun.compiler.spec`` re-exports it).
Attributes load lazily, so importing one module does not import torch's exporter.
"""

from importlib import import_module
from typing import Any

_WHERE = {
    "check_batch": "checks", "check_compile_flags": "checks", "check_dataloader": "checks",
    "CompileError": "errors", "CompileFailed": "errors",
    "CompileResult": "result", "compile_only": "flow", "exit_code": "result", "load_program": "result", "validate_only": "flow",
    "group_learning_rates": "optim", "optimizer_spec_from_params": "optim", "optimizer_spec_from_torch": "optim",
    "optimizer_spec_from_config": "optim", "settings_from_config": "settings",
    "CompileSettings": "settings", "settings_from_params": "settings",
    "LossScalingSpec": "spec", "OptimizerSpec": "spec", "ProgramSpec": "spec", "TensorSpec": "spec",
    "WSE2": "wafer", "WaferSpec": "wafer", "MEMORYX": "wafer", "MemoryXSpec": "wafer",
    "plan_program": "flow", "place_streaming": "streaming", "module_with_weights": "cache.program_io",
    "bind_weights": "cache.program_io", "has_weight_values": "cache.program_io",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'csrun.compiler' has no attribute {name!r}")
    return getattr(import_module(f"csrun.compiler.{_WHERE[name]}"), name)
