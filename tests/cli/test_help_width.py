"""``--help`` fits the terminal, or COLUMNS, or 80 columns, and lists ``--version``; every long option
takes dashes or underscores (issue 34, item 7.5 and 7.6)."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import termios

import pytest

from csrun.errors import UsageError
from csrun.help_style import Parser, wrap_help

from tests.conftest import BIN, REPO, VENV_BIN, base_env

LAUNCHERS = [[str(BIN / "csrun_wse")], [str(BIN / "csrun_cpu")]]
SHARING_THE_STYLE = [[str(VENV_BIN / "python"), str(REPO / "models" / "fc_mnist" / "run.py")], [str(BIN / "cs_emulator")]]


def _help(argv: list[str], columns: str | None) -> str:
    env = base_env()
    env.pop("COLUMNS", None)
    if columns is not None:
        env["COLUMNS"] = columns
    done = subprocess.run([*argv, "--help"], env=env, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _widest(text: str) -> int:
    return max(len(line) for line in text.splitlines())


@pytest.mark.parametrize("argv", LAUNCHERS + SHARING_THE_STYLE, ids=["csrun_wse", "csrun_cpu", "run.py", "cs_emulator"])
@pytest.mark.parametrize("columns, width", [("80", 80), (None, 80), ("60", 60)])
def test_help_fits_columns_and_lists_version(argv: list[str], columns: str | None, width: int) -> None:
    text = _help(argv, columns)
    assert _widest(text) <= width, "\n".join(line for line in text.splitlines() if len(line) > width)
    assert "  --version  print the version and exit" in text.splitlines()
    assert text.splitlines()[-1].strip(), "no blank tail"


def test_the_launchers_help_still_names_every_option() -> None:
    text = _help(LAUNCHERS[0], "80")
    for option in ("--total-nodes", "--log-dir", "--preempt-lead", "--emulator", "--def_gres_node", "-h, --help"):
        assert option in text
    wide = _help(LAUNCHERS[0], "400")
    assert len(wide.splitlines()) < len(text.splitlines()) and _widest(wide) > 80  # COLUMNS wide: one line each


def test_on_a_terminal_help_takes_its_width() -> None:
    """stdout a terminal of 120 columns, COLUMNS unset: wrapped at 120, not 80."""
    main, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 120, 0, 0))
    env = base_env()
    env.pop("COLUMNS", None)
    try:
        proc = subprocess.Popen([*LAUNCHERS[0], "--help"], stdout=side, stderr=subprocess.PIPE, env=env, cwd=REPO)
        os.close(side)
        chunks = []
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        assert proc.wait(timeout=60) == 0
    finally:
        os.close(main)
    text = b"".join(chunks).decode().replace("\r\n", "\n")
    assert 80 < _widest(text) <= 120, text


def test_wrap_help_indents_an_options_continuation() -> None:
    text = wrap_help(["summary " * 12, "  --opt VALUE  " + "word " * 20], width=40)
    lines = text.splitlines()
    assert all(len(line) <= 40 for line in lines)
    first_option = next(i for i, line in enumerate(lines) if line.startswith("  --opt"))
    assert all(not line.startswith(" ") for line in lines[:first_option])  # prose: at the margin
    assert all(line.startswith("      word") for line in lines[first_option + 1:])
    assert wrap_help(["x" * 50], width=40) == "x" * 50  # one word is not broken


def _parser() -> Parser:
    p = Parser("prog", "summary")
    p.add_argument("--model_dir")
    p.add_argument("--max-steps", type=int)
    p.add_argument("-o", "--out")
    return p


@pytest.mark.parametrize("argv, dest, value", [
    (["--model-dir", "X"], "model_dir", "X"), (["--model_dir=X"], "model_dir", "X"), (["--model-dir=X"], "model_dir", "X"),
    (["--max_steps", "3"], "max_steps", 3), (["--max-steps=3"], "max_steps", 3), (["-o", "Y"], "out", "Y"),
])
def test_parser_takes_either_spelling(argv: list[str], dest: str, value: object) -> None:
    assert getattr(_parser().parse_args(argv), dest) == value


@pytest.mark.parametrize("argv", [["--model-dirs", "X"], ["--max--steps", "3"], ["--max_step", "3"]])
def test_parser_still_refuses_a_misspelt_option(argv: list[str]) -> None:
    with pytest.raises(UsageError, match=f"unrecognized arguments: {argv[0]}"):
        _parser().parse_args(argv)
