"""Which signal means "preempted: checkpoint and stop", and how many fruitless requeues to allow.

One decision shared by the launchers that requeue a job (``csrun_wse --use-sbatch``'s batch
script, ``csrun_cpu --use-sbatch``'s submitit wrapper) and the runner that checkpoints on it.

Environment:

``CSRUN_PREEMPT_SIGNAL`` (default ``USR1``)
    The signal a batch job asks Slurm for before its time limit (``--signal=B:SIG@LEAD``),
    traps and forwards to its step, and on which the runner checkpoints and stops with exit
    code ``128 + signal`` (138 for USR1, 140 for USR2). One of ``USR1``, ``USR2``, ``TERM``
    (``SIG`` prefix and case optional). SIGTERM always means "checkpoint and stop" as well.
``SUBMITIT_PREEMPT_SIGNAL`` (default ``USR2``)
    submitit's own variable: the signal submitit's job wrapper asks for and handles. The
    command it runs ignores that signal (unless it is also ``CSRUN_PREEMPT_SIGNAL``) and is
    sent ``CSRUN_PREEMPT_SIGNAL`` by the wrapper instead.
``CSRUN_MAX_IDLE_REQUEUES`` (default 3)
    How many preemptions in a row may end a run that gained no step (the time limit too short
    for compile + one checkpoint interval, say) before the runner stops asking to be requeued:
    it then exits 1 with one line saying so, and neither launcher requeues a run whose exit
    code is not ``128 + signal``.
"""

from __future__ import annotations

import os
import signal
from typing import Mapping

from csrun.env_settings import env_name, env_settings
from csrun.errors import ConfigError

PREEMPT_SIGNAL_ENV = env_name("preempt_signal")
SUBMITIT_SIGNAL_ENV = "SUBMITIT_PREEMPT_SIGNAL"
MAX_IDLE_REQUEUES_ENV = env_name("max_idle_requeues")
CHOICES = ("USR1", "USR2", "TERM")
"""Signals that may mean "preempted" (others kill, stop or interrupt by convention)."""


def _parse(name: str, value: str, choices: tuple[str, ...]) -> signal.Signals:
    text = value.strip().upper()
    text = text[3:] if text.startswith("SIG") else text
    if text not in choices:
        raise ConfigError(f"{name}={value!r} is not a preemption signal: use one of {', '.join(choices)}")
    return signal.Signals["SIG" + text]


def preemption_signal(environ: Mapping[str, str] | None = None) -> signal.Signals:
    """``CSRUN_PREEMPT_SIGNAL`` (default SIGUSR1); a :class:`ConfigError` naming a bad value."""
    return _parse(PREEMPT_SIGNAL_ENV, env_settings(environ).preempt_signal, CHOICES)


def submitit_signal(environ: Mapping[str, str] | None = None) -> signal.Signals:
    """The signal submitit's wrapper handles: ``SUBMITIT_PREEMPT_SIGNAL`` (default SIGUSR2)."""
    env = os.environ if environ is None else environ
    value = env.get(SUBMITIT_SIGNAL_ENV, "") or "USR2"
    return _parse(SUBMITIT_SIGNAL_ENV, value, tuple(s.name[3:] for s in signal.Signals if s.name.startswith("SIG")))


def max_idle_requeues(environ: Mapping[str, str] | None = None) -> int:
    """``CSRUN_MAX_IDLE_REQUEUES`` (default 3, at least 1); a :class:`ConfigError` naming a bad value."""
    return env_settings(environ).max_idle_requeues
