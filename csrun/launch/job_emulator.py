"""Run one task of a ``csrun_wse --emulator`` job: on the chief, with a cs_emulator beside it.

Usage (csrun_wse builds this; users need not)::

    python -m csrun.launch.job_emulator [--device DEVICE] -- COMMAND [ARGS...]

On the chief (rank 0, see :mod:`csrun.cluster`) it starts ``cs_emulator --listen
127.0.0.1:0 --device DEVICE`` on this node, waits until it listens, and runs COMMAND with
``CS_IP=127.0.0.1:<port>``; when COMMAND ends, whatever its exit, the server is stopped
(SIGTERM, then SIGKILL after 10 s), and the server also dies if this process is killed
(``PR_SET_PDEATHSIG``). Every other task runs COMMAND unchanged. The exit code is COMMAND's.

Environment read: ``CSRUN_EMULATOR_TOKEN`` (required: csrun_wse generates one per job; the
server and the chief's client both read it), ``CSRUN_EMULATOR_START_TIMEOUT`` (seconds to
wait for the server to listen, default 60), the rank variables of :mod:`csrun.cluster`.
Environment set for COMMAND on the chief: ``CS_IP``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time

from csrun.env_settings import env_name, env_settings
from csrun.cluster import cluster_info
from csrun.errors import LaunchError, UsageError
from csrun.launch.process import die_with_parent, run_child, run_cli

PROG = "csrun_wse --emulator"
LISTENING = "cs_emulator: listening on "


def _server_preexec() -> None:
    """The job's server dies with this wrapper and ignores the preemption signals: they are for the
    tasks (the step's process group gets them on Ctrl-C or a preemption, the server with it)."""
    die_with_parent(signal.SIGTERM)()
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_IGN)


def start_emulator(device: str, env: dict[str, str], timeout: float) -> tuple[subprocess.Popen[str], str]:
    """Start a cs_emulator on 127.0.0.1 with a free port; return it and its ``HOST:PORT``."""
    server = subprocess.Popen(
        [sys.executable, "-m", "csrun.cli.cs_emulator", "--listen", "127.0.0.1:0", "--device", device],
        env=env, stdout=subprocess.PIPE, text=True, preexec_fn=_server_preexec,
    )
    found: list[str] = []
    ready = threading.Event()

    def read_stdout() -> None:
        for line in server.stdout or ():
            if not found and line.startswith(LISTENING):
                found.append(line[len(LISTENING):].split()[0])
                ready.set()
            print(line, end="", file=sys.stderr, flush=True)
        ready.set()

    threading.Thread(target=read_stdout, daemon=True).start()
    if not ready.wait(timeout) or not found:
        stop_emulator(server)
        raise LaunchError(f"cs_emulator did not start listening within {timeout:g}s (exit code {server.poll()})")
    return server, found[0]


def stop_emulator(server: subprocess.Popen[str]) -> None:
    """SIGTERM the server, then SIGKILL if it has not stopped within 10 s."""
    if server.poll() is not None:
        return
    server.terminate()
    try:
        server.wait(10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def _body(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m csrun.launch.job_emulator")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise UsageError("no command given after --")
    env = dict(os.environ)
    if not cluster_info().is_chief:
        return run_child(command, env, keep_fds=True)
    settings = env_settings(env)
    if not settings.emulator_token:
        raise LaunchError(f"{env_name('emulator_token')} is not set (csrun_wse --emulator sets one per job)")
    timeout = settings.emulator_start_timeout
    started = time.monotonic()
    server, address = start_emulator(args.device, env, timeout)
    print(f"csrun_wse: emulator for this job at {address} (device {args.device}, started in {time.monotonic() - started:.1f}s)", file=sys.stderr, flush=True)
    try:
        return run_child(command, {**env, "CS_IP": address}, keep_fds=True)
    finally:
        stop_emulator(server)


def main(argv: list[str] | None = None) -> int:
    """The wrapper's entry point; returns COMMAND's exit code."""
    return run_cli(PROG, _body, argv)


if __name__ == "__main__":
    sys.exit(main())
