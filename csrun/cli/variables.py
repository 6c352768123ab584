"""Every ``CSRUN_*`` variable csrun knows, and what the environment sets of them.

The registry is :mod:`csrun.env_settings` (the knobs, the launch contract, the shell's) plus the
site config's fields (:func:`csrun.site.site_variables`). ``csrun env`` shows every knob's value
in effect and ``CS_IP`` (:func:`settings_section`) and what is set (:func:`environment_section`);
the launchers name a variable that looks like a misspelt one (:func:`misspelt`) before they
start a job.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from csrun.env_settings import (CONTRACT, PREFIX, SHELL, EnvSettings, Variable, env_name, env_settings, knobs,
                                shown_default, unknown_names)
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


CS_IP = "CS_IP"
"""The system's address a launcher passes through (run.py's ``--cs_ip`` default; :mod:`csrun.cluster`)."""


def settings_section(env: Mapping[str, str]) -> dict[str, Any]:
    """Every knob (:class:`~csrun.env_settings.EnvSettings`) with the value in effect and where it
    comes from (``CSRUN_<X>``, or csrun's default; a bad value marked, a secret hidden), then ``CS_IP``.
    The site config's values are the ``site`` section's."""
    section: dict[str, Any] = {}
    for f in dataclasses.fields(EnvSettings):
        name = env_name(f.name)
        raw = env.get(name, "")
        given = bool(raw.strip())
        try:
            value = getattr(env_settings({name: raw}), f.name)
        except ConfigError as exc:
            section[name] = f"BAD: {exc}"
            continue
        if f.metadata.get("secret"):
            shown = "hidden" if given else "none"
        else:
            shown = shown_default(value) or "none"
        section[name] = f"{shown}  ({'set' if given else 'default'})"
    cs_ip = env.get(CS_IP, "").strip()
    section[CS_IP] = f"{cs_ip}  (set: run.py's --cs_ip default)" if cs_ip else \
        "none  (unset: run.py runs on the CPU, or on the embedded emulator under csrun_wse)"
    return section


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
