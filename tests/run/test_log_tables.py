"""Tables in a job log (not a terminal) keep one line per row and whole headers (csrun.consoles)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from csrun.consoles import LOG_WIDTH, console
from tests.run.conftest import DEBUG_YAML

Run = Callable[..., int]


def test_the_placement_table_in_a_log_is_one_line_per_row(fc_mnist: Run, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert fc_mnist("-p", str(DEBUG_YAML), "-m", "train", "-o", str(tmp_path / "md"), "--compile_only") == 0
    out = capsys.readouterr().out.splitlines()
    [header] = [line for line in out if "┃ layer" in line]
    for word in ("weights", "opt. state", "activations", "SRAM need/avail", "MFLOP/sample", "stage µs"):
        assert word in header, header  # not cut to "weigh…" at 80 columns
    rows = [line for line in out if line.startswith("│ ")]
    assert rows and all(line.count("│") == 10 for line in rows)  # each row on one line: 9 cells, 10 bars


def test_off_a_terminal_the_width_is_columns_or_the_log_width(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with open(tmp_path / "log", "w") as f:
        monkeypatch.delenv("COLUMNS", raising=False)
        assert console(file=f).width == LOG_WIDTH
        monkeypatch.setenv("COLUMNS", "200")
        assert console(file=f).width == 200
        monkeypatch.setenv("COLUMNS", "x")
        assert console(file=f).width == LOG_WIDTH
