"""Slurm time limits for --use-sbatch, in minutes as submitit wants them."""

from __future__ import annotations

import pytest

from csrun.errors import UsageError
from csrun.launch.sbatch import time_limit_minutes


@pytest.mark.parametrize("text, minutes", [("", 0), ("30", 30), ("01:00:00", 60), ("00:00:30", 1), ("5:30", 6), ("1-00", 1440), ("1-02:03", 1563), ("2-00:00:01", 2881)])
def test_time_limits(text: str, minutes: int) -> None:
    assert time_limit_minutes(text) == minutes


@pytest.mark.parametrize("text", ["soon", "1h", "-5", "1:2:3:4"])
def test_bad_time_limits(text: str) -> None:
    with pytest.raises(UsageError):
        time_limit_minutes(text)
