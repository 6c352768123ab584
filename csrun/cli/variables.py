"""Every ``CSRUN_*`` variable csrun knows, and what the environment sets of them.

The registry is :mod:`csrun.env_settings` (the knobs, the launch contract, the shell's) plus the
site config's fields (:func:`csrun.site.site_variables`). ``csrun env`` shows what is set
(:func:`environment_section`); the launchers name a variable that looks like a misspelt one
(:func:`misspelt`) before they start a job.
"""

from __future__ import annotations

from typing import Any, Mapping

from csrun.env_settings import CONTRACT, PREFIX, SHELL, Variable, env_settings, knobs, unknown_names
from csrun.errors import ConfigError
from csrun.site import site_variables


def every_variable() -> tuple[Variable, ...]:
    """Every ``CSRUN_*`` variable csrun reads or sets, each once."""
    return knobs() + site_variables() + CONTRACT + SHELL


def environment_section(env: Mapping[str, str]) -> dict[str, Any]:
    """The ``CSRUN_*`` variables set in ``env``: each with its value and meaning (a secret's value
    hidden), a bad knob's error, and the names csrun does not know."""
    by_name = {v.name: v for v in every_variable()}
    section: dict[str, Any] = {}
    for name in sorted(k for k in env if k.startswith(PREFIX)):
        variable = by_name.get(name)
        if variable is None:
            continue
        value = "(set, hidden)" if variable.secret else env[name]
        error = _error_of(variable, env[name])
        section[name] = f"{value}  [{variable.kind}] " + (f"BAD: {error}" if error else variable.doc)
    unknown = unknown_names(env, by_name)
    if unknown:
        section["unknown"] = [f"{name} (did you mean {close}?)" if close else name for name, close in unknown]
    return section or {"set": "none"}


def _error_of(variable: Variable, value: str) -> str:
    if variable.kind != "knob":
        return ""
    try:
        env_settings({variable.name: value})
    except ConfigError as exc:
        return str(exc)
    return ""


def misspelt(env: Mapping[str, str]) -> list[str]:
    """One warning line for each ``CSRUN_*`` name in ``env`` that is not csrun's but close to one."""
    known = [v.name for v in every_variable()]
    return [f"{name} is not a csrun setting (did you mean {close}?); it has no effect"
            for name, close in unknown_names(env, known) if close is not None]
