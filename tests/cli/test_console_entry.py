"""A command's console entry: the exit code ``main`` chose stands, whatever Ctrl-C comes after it.

A person's second Ctrl-C can land just as the command finishes (its child saved and stopped on
the first); the interpreter's shutdown then must not print a traceback or die by SIGINT in place
of the command's exit code (a flaky ``test_a_second_ctrl_c_stops_at_once`` found it).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.conftest import REPO

PROGRAM = textwrap.dedent("""
    import atexit, os, signal, sys, time
    from csrun.cli.common import console_entry

    def late_ctrl_c() -> None:  # runs during the interpreter's exit, as a late press would land
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)

    def main() -> int:
        if sys.argv[1] == "raises":
            raise KeyboardInterrupt
        atexit.register(late_ctrl_c)
        return int(sys.argv[1])

    console_entry(main)()
""")


def run(arg: str) -> subprocess.CompletedProcess[str]:
    """The program above with ``arg``, from the checkout."""
    return subprocess.run([sys.executable, "-c", PROGRAM, arg], cwd=REPO, capture_output=True, text=True, timeout=60)


def test_a_ctrl_c_while_the_command_exits_keeps_its_code() -> None:
    for code in (0, 130, 3):
        done = run(str(code))
        assert done.returncode == code, done.stderr
        assert "KeyboardInterrupt" not in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_ctrl_c_the_body_did_not_handle_exits_130_without_a_traceback() -> None:
    done = run("raises")
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr, done.stderr


PRINTER = textwrap.dedent("""
    import sys
    from csrun.launch.process import run_cli

    def body(args: list[str]) -> int:
        for _ in range(10000):
            print(args[0] * 300, file=sys.stderr)
        return 0

    sys.exit(run_cli("printer", body, sys.argv[1:]))
""")


def test_lines_of_commands_sharing_a_stream_do_not_mix_under_pythonunbuffered() -> None:
    """Two commands print into one pipe under ``PYTHONUNBUFFERED=1`` (as a job's tasks and its
    launcher do): every line comes out whole. Unbuffered, print writes its text and its newline
    apart, and the other's line lands between them (a CI run's ``...bin/pythoncsrun_wse: task rank 2``)."""
    import os

    read_end, write_end = os.pipe()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)}
    printers = [subprocess.Popen([sys.executable, "-c", PRINTER, letter], stderr=write_end, env=env, cwd=REPO)
                for letter in "AB"]
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        lines = pipe.read().decode().splitlines()
    assert [p.wait(timeout=60) for p in printers] == [0, 0]
    mixed = [line[:20] + "..." + line[-20:] for line in lines if line not in ("A" * 300, "B" * 300)]
    assert not mixed and len(lines) == 20000, (len(lines), mixed[:5])


def test_a_users_own_loop_prints_whole_lines_from_initialize_on() -> None:
    """An R1.x loop (cbtorch.initialize, no run.py) under ``PYTHONUNBUFFERED=1``, as a job's task
    runs: from initialize on its streams write a line at once, as the commands' do."""
    import os

    program = ("import sys; import csrun.torch as cbtorch; before = sys.stderr.write_through; cbtorch.initialize(cpu=True); "
               "print(before, sys.stderr.write_through, sys.stderr.line_buffering, sys.stdout.line_buffering)")
    done = subprocess.run([sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "False", "True", "True"], done.stdout
