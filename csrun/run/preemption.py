"""Preemption: SIGTERM / SIGUSR1 on the chief mean "checkpoint and stop at the next step".

On the chief, :class:`Preemption` installs handlers that only set a flag. The training
loop checks it at every step boundary (in the step closure, after the loss checks): it
saves ``checkpoint_<step>.mdl`` (unless that step was just saved), leaves the Session
(which stops the streamers) and run() returns ``128 + signal number`` — 143 for SIGTERM,
138 for SIGUSR1 — the shell's convention for "ended by this signal". A batch job that asked
for ``#SBATCH --signal=USR1@60`` (or ``B:USR1``) can requeue itself on that exit code and
continue with ``--resume``. A second signal of the same kind while the first is pending is
ignored; SIGINT (Ctrl-C) keeps Python's default (KeyboardInterrupt, no checkpoint).

On streamers both signals are ignored while they stream: Slurm signals every task of the
step, and a streamer that died first would make the chief's last step fail; the chief
stops them when it has saved. (A streamer left without its chief ends on its stream
timeout.)
"""

from __future__ import annotations

import signal
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Preempted(Exception):
    """Raised at a step boundary after the preemption checkpoint was written."""

    def __init__(self, signum: int, step: int) -> None:
        self.signum = signum
        self.step = step
        super().__init__(f"stopped by {signal.Signals(signum).name} at global step {step}")

    @property
    def exit_code(self) -> int:
        """``128 + signum`` (143 for SIGTERM, 138 for SIGUSR1)."""
        return 128 + self.signum


class Preemption:
    """Signal flag for the chief (use as a context manager around the training loop)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._old: dict[int, object] = {}

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is None:
            self.signum = signum

    @property
    def requested(self) -> bool:
        """True once a preemption signal arrived."""
        return self.signum is not None

    def __enter__(self) -> "Preemption":
        for sig in SIGNALS:
            try:
                self._old[sig] = signal.signal(sig, self._handler)
            except ValueError:  # not the main thread: no handlers, no preemption
                pass
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)  # type: ignore[arg-type]
        self._old.clear()


def ignore_on_streamer() -> None:
    """Streamers: ignore the preemption signals (the chief stops them after its checkpoint)."""
    for sig in SIGNALS:
        try:
            signal.signal(sig, signal.SIG_IGN)
        except ValueError:
            pass
