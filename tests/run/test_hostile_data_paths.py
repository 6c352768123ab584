"""Hostile HDF5 data through GPT-2's run.py (issue 45 item 5): token ids past the vocabulary and
labels of -7 used to reach an embedding or the loss kernel (``IndexError: index out of range in
self``, ``Target -7 is out of bounds``). Now the reader names the file, the field, the row and the
value in one line, exit 2, on the CPU path (under csrun_cpu) and on the device (the embedded
emulator). The reader checks every batch it reads, so a bad row later in the data ends the run
the same way at its batch (``python -m tests.run.input_fuzz --kinds data`` spoils later rows too)."""

from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.run.input_fuzz import params_text, spoil_data

GPT2 = REPO / "models" / "gpt2"


def hostile_run(tmp_path: Path, field: str, row: int, value: int) -> tuple[Path, Path]:
    """(params, shard): GPT-2's debug params over a copy of its data holding ``value`` in ``row`` of ``field``."""
    data = spoil_data("gpt2", field, row, value, tmp_path / "data")
    edits: list[tuple[tuple[Any, ...], Any]] = [(("runconfig", "max_steps"), 3), (("runconfig", "log_steps"), 1)]
    for section in ("train_input", "eval_input"):
        edits += [((section, "data_dir"), str(data)), ((section, "shuffle"), False)]
    params = tmp_path / "params.yaml"
    params.write_text(params_text("gpt2_debug.yaml", tuple(edits)))
    return params, data / "shard_00000.h5"


def test_ids_past_the_vocabulary_on_the_cpu_path_under_csrun_cpu(tmp_path: Path) -> None:
    params, shard = hostile_run(tmp_path, "input_ids", 1, 512)
    env = {k: v for k, v in os.environ.items() if k not in ("CS_IP", "CSRUN_LAUNCHER")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # python-pt beside csrun_cpu
    done = subprocess.run([str(Path(sys.executable).parent / "csrun_cpu"), "--alloc-node", "False", "python-pt",
                           str(GPT2 / "run.py"), "-p", str(params), "-m", "train", "--cpu", "-o", str(tmp_path / "md")],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if "error" in line]  # python-pt's notice aside
    assert errors == [f"run.py: error: shard {str(shard)!r}: field 'input_ids' row 1, position 0 holds 512, outside "
                      f"0..511 (token ids of the data's 512-token vocabulary); fix or re-convert the data "
                      f"(cs_convert_hdf5)"], done.stderr


def test_a_label_of_minus_7_on_the_embedded_emulator(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from csrun.torch import process_state

    params, shard = hostile_run(tmp_path, "labels", 1, -7)
    monkeypatch.delenv("CS_IP", raising=False)
    monkeypatch.delenv("CSRUN_LAUNCHER", raising=False)
    for name in ("model", "data", "shapes_only"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(GPT2))
    monkeypatch.setattr(sys, "argv", [str(GPT2 / "run.py"), "-p", str(params), "-m", "train", "--cs_ip", "embedded",
                                      "-o", str(tmp_path / "md")])
    process_state.reset_for_tests()
    try:
        with pytest.raises(SystemExit) as ended:
            runpy.run_path(str(GPT2 / "run.py"), run_name="__main__")
    finally:
        process_state.reset_for_tests()
        for name in ("model", "data", "shapes_only"):
            sys.modules.pop(name, None)
    out = capsys.readouterr()
    assert ended.value.code == 2, out.err
    assert "csrun: system path (" in out.err + out.out  # the run took the device's path
    assert out.err.strip().splitlines()[-1] == (f"run.py: error: shard {str(shard)!r}: field 'labels' row 1, position 0 holds -7, "
                               f"outside 0..511 (token ids of the data's 512-token vocabulary); fix or re-convert the "
                               f"data (cs_convert_hdf5)")
