"""The compile settings an R1.6 script conveys through the API, handed to the backend.

The R1.6 zoo states loss scaling and clipping by building ``amp.GradScaler(...)`` and the
compute dtype by ``initialize(use_cbfloat16=...)``, not in a settings object. Each of those
calls changes this process's settings here; they are handed to the backend at once (and again
by ``initialize``), through :meth:`csrun.torch.backend.Backend.apply_settings`: the device
compiles them into the program (a change after its compile is refused), the CPU's eager
backend clips as the device would.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from csrun.compiler.settings import CompileSettings
from csrun.torch.process_state import state

_settings = CompileSettings()


def current() -> CompileSettings:
    """The settings conveyed so far."""
    return _settings


def update(**changes: Any) -> None:
    """Change settings (:class:`~csrun.compiler.CompileSettings` field names) and hand them over."""
    global _settings
    _settings = replace(_settings, **changes)
    hand_over()


def hand_over() -> None:
    """Give the backend the settings conveyed so far."""
    state().backend.apply_settings(_settings)


def reset_for_tests() -> None:
    """Forget the conveyed settings (tests only)."""
    global _settings
    _settings = CompileSettings()
