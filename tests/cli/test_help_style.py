"""One ``--help`` style for every command, each default shown once; a bad flag is one line (issue 14)."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.conftest import REPO, VENV_BIN

COMMANDS = [
    (["csrun_wse"], "csrun_wse"), (["csrun_cpu"], "csrun_cpu"), (["csrun"], "csrun"), (["csrun", "env"], "csrun env"),
    (["cs_emulator"], "cs_emulator"), (["cs_convert_hdf5"], "cs_convert_hdf5"),
    (["python", "models/fc_mnist/run.py"], "run.py"),
]


def _run(argv: list[str], env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VENV_BIN / argv[0]), *argv[1:], *extra], env=env, capture_output=True, text=True,
                          timeout=60, cwd=REPO)


@pytest.mark.parametrize("argv, prog", COMMANDS)
def test_help_reads_the_same_everywhere(no_slurm_env: dict[str, str], argv: list[str], prog: str) -> None:
    done = _run(argv, no_slurm_env, "--help")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    title = next(i for i, line in enumerate(lines) if line.startswith("options ("))
    assert lines[0].startswith(f"usage: {prog} ") and lines[1] == "" and lines[2] and lines[title - 1] == "", lines[:title]
    assert "" not in lines[2:title - 1] and lines[title].endswith("):"), lines[:title + 1]
    entries: list[str] = []  # one per option: its wrapped lines (indented six) joined to it
    for line in lines[title + 1:lines.index("  -h, --help  show this help and exit") + 1]:
        if line.startswith("      ") and entries:
            entries[-1] += " " + line.strip()
        else:
            entries.append(line)
    options = entries
    assert len(options) >= 2, done.stdout
    for line in options:
        assert re.match(r"^  -{1,2}\w", line), f"one option per line, indented two: {line!r}"
        assert line.count("default") <= 1, f"a default shown twice: {line!r}"
        assert "(default: None)" not in line, f"Python's None leaked into help: {line!r}"


@pytest.mark.parametrize("argv, prog", COMMANDS)
def test_a_bad_flag_is_one_line(no_slurm_env: dict[str, str], argv: list[str], prog: str) -> None:
    done = _run(argv, no_slurm_env, "--no-such-flag", "x")
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{prog.split()[0]}: error: ") and "--no-such-flag" in lines[0], lines[0]
    assert "--help" in lines[0] and "Traceback" not in done.stderr
