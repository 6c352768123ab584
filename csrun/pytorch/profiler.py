"""``cstorch.profiler``: the system's op profiler, which csrun's device does not have.

``schedule(start_step=-1, end_step=-1)`` is the steps to profile; ``profile(schedule=...)`` a
context around the loop. With the default schedule (no steps) both are accepted and the
profile is empty (``op_profiler_json`` None); asking for steps to be profiled raises one line:
time csrun's steps with its own input table and ``cs_emulator`` logs instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from csrun.torch.r1.unsupported import LegacyNameError


@dataclass(frozen=True)
class schedule:  # noqa: N801 - the 2.x name
    """The steps to profile (``-1``: none)."""

    start_step: int = -1
    end_step: int = -1

    def __post_init__(self) -> None:
        if self.start_step != -1 or self.end_step != -1:
            raise LegacyNameError(f"cstorch.profiler.schedule(start_step={self.start_step}, end_step={self.end_step}):"
                                  f" csrun's device has no op profiler; leave runconfig.op_profiler_config out")


class profile:  # noqa: N801 - the 2.x name
    """A context around the loop; its profile is empty."""

    def __init__(self, schedule: schedule | None = None, **kwargs: Any) -> None:
        self.schedule = schedule
        self.op_profiler_json: Any = None
        """None: nothing was profiled."""

    def __enter__(self) -> "profile":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def get_summary(self) -> str:
        """Empty: nothing was profiled."""
        return ""


__all__ = ["schedule", "profile"]
