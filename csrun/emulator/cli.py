"""cs_emulator — serve the wafer emulator on a TCP port, standing in for a network-attached system.

Usage::

    cs_emulator [--listen HOST:PORT] [--device cpu|cuda|cuda:I] [--token-file PATH]
                [--queue-depth N] [--max-header-bytes N] [--max-tensors N]
                [--max-tensor-bytes N] [--max-frame-bytes N] [--max-program-bytes N]
                [--hello-timeout S] [--log-level LEVEL]

A job reaches it with ``run.py --cs_ip HOST:PORT`` (or ``CS_IP``). The server executes the
job's compiled program (forward, backward, optimizer, LR schedule, loss scaling) with the
weights resident on ``--device``, for one job at a time: another job that connects meanwhile
is told ``system busy: in use by job J since T``. A job that disconnects frees the system.

Options:

``--listen HOST:PORT``
    Address to listen on (default ``127.0.0.1:9000``; ``:9000`` is the default port when only a
    host is given; port 0 picks a free port, which is printed).
``--device DEVICE``
    ``cpu`` (default), ``cuda`` or ``cuda:I``: where weights, optimizer state and compute live.
``--token-file PATH``
    File holding the shared secret clients must present (default ``~/.csrun/emulator.token``).
    Used when ``CSRUN_EMULATOR_TOKEN`` is unset. When the file does not exist, a fresh token is
    generated with :mod:`secrets`, written there with mode 0600, and the path is printed.
``--queue-depth N``
    Steps the server queues ahead of the one running (default 2).
``--max-header-bytes N`` (default 1 MiB), ``--max-tensors N`` (4096 per frame),
``--max-tensor-bytes N`` (1 GiB), ``--max-frame-bytes N`` (4 GiB of buffers per frame),
``--max-program-bytes N`` (2 GiB)
    Size limits on every frame field; a frame over any limit closes that connection.
``--hello-timeout S``
    Seconds a new connection has to authenticate (default 10).
``--log-level LEVEL``
    ``debug``, ``info`` (default), ``warning`` or ``error``; logs go to stderr.

Environment:

``CSRUN_EMULATOR_TOKEN``
    The token (takes precedence over ``--token-file``). Clients read the same variable.

Signals: SIGTERM and SIGINT stop the server cleanly (connections are closed, exit status 0).
Exit status: 0 after a clean stop, 2 for a bad option or value, 1 if the address cannot be bound.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from csrun.emulator import wire
from csrun.emulator.auth_token import DEFAULT_TOKEN_FILE, TOKEN_ENV, server_token
from csrun.errors import UsageError, UserError

PROG = "cs_emulator"


def _parser() -> argparse.ArgumentParser:
    d = wire.Limits()
    p = argparse.ArgumentParser(prog=PROG, description="Serve the wafer emulator over TCP (see the module docstring).")
    p.add_argument("--listen", default="127.0.0.1:9000", help="HOST:PORT to listen on (default 127.0.0.1:9000)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:I (default cpu)")
    p.add_argument("--token-file", default=DEFAULT_TOKEN_FILE, help=f"token file (default {DEFAULT_TOKEN_FILE})")
    p.add_argument("--queue-depth", type=int, default=2, help="steps queued ahead (default 2)")
    p.add_argument("--max-header-bytes", type=int, default=d.max_header_bytes)
    p.add_argument("--max-tensors", type=int, default=d.max_tensors)
    p.add_argument("--max-tensor-bytes", type=int, default=d.max_tensor_bytes)
    p.add_argument("--max-frame-bytes", type=int, default=d.max_frame_bytes)
    p.add_argument("--max-program-bytes", type=int, default=d.max_program_bytes)
    p.add_argument("--hello-timeout", type=float, default=10.0)
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the server until SIGTERM/SIGINT; returns the exit status."""
    from csrun.address import parse_address
    from csrun.emulator.server import EmulatorServer

    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s cs_emulator %(levelname)s %(message)s")
    try:
        host, port = parse_address(args.listen, allow_zero=True)
        for name in ("queue_depth", "max_header_bytes", "max_tensors", "max_tensor_bytes", "max_frame_bytes",
                     "max_program_bytes"):
            if getattr(args, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
        token, written = server_token(args.token_file)
        limits = wire.Limits(max_header_bytes=args.max_header_bytes, max_tensors=args.max_tensors,
                             max_tensor_bytes=args.max_tensor_bytes, max_frame_bytes=args.max_frame_bytes,
                             max_program_bytes=args.max_program_bytes)
        from csrun.emulator.engine import parse_device

        parse_device(args.device)
        try:
            server = EmulatorServer(token=token, host=host, port=port, device=args.device,
                                    queue_depth=args.queue_depth, limits=limits, hello_timeout=args.hello_timeout)
        except OSError as exc:
            print(f"{PROG}: error: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
            return 1
    except UserError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return exc.exit_code

    def stop(signum: int, _frame: object) -> None:
        logging.getLogger("csrun.emulator.server").info("signal %d: stopping", signum)
        server.stopping = True

    previous = {}
    if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
        previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    if written:
        print(f"{PROG}: wrote a new token to {written} (mode 0600); clients read it from there or {TOKEN_ENV}",
              flush=True)
    print(f"{PROG}: listening on {server.address[0]}:{server.address[1]} (device {args.device})", flush=True)
    try:
        server.serve_forever()
    finally:
        server.shutdown()
        for s, h in previous.items():
            signal.signal(s, h)
    print(f"{PROG}: stopped", flush=True)
    return 0


def console_main() -> None:
    """Entry point of the ``cs_emulator`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    console_main()
