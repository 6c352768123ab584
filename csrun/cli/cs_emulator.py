"""cs_emulator — serve the wafer emulator on a TCP port, standing in for a network-attached system.

Usage::

    cs_emulator [--listen HOST:PORT] [--device cpu|cuda|cuda:I] [--token-file PATH]
                [--allow-weak-token] [--tls-cert PATH --tls-key PATH]
                [--hello-deadline S] [--max-pending N] [--idle-limit S] [--max-queued N]
                [--wait-per-job S] [--queue-depth N] [--max-header-bytes N] [--max-tensors N]
                [--max-tensor-bytes N] [--max-frame-bytes N] [--max-program-bytes N]
                [--log-level LEVEL]

A job reaches it with ``run.py --cs_ip HOST:PORT`` (or ``CS_IP``). The server executes the
job's compiled program (forward, backward, optimizer, LR schedule, loss scaling) with the
weights resident on ``--device``, for one job at a time: other jobs that connect meanwhile wait
in a first-come, first-served queue of at most ``--max-queued`` jobs, each told its position,
the jobs ahead and when its turn is expected (the job logs ``cs_emulator at HOST:PORT is busy
with job J; queued at position 2, after 1 queued job (K); expected wait 4.1 min (a job here takes
2.2 min); this job waits up to 2 h (1 h per job before it: cs_emulator --wait-per-job)``) and given
the system in turn; a job finding the queue full is told ``system busy: in use by job J since T,
and its queue is full (...)``. A job waits up to its own ``CSRUN_QUEUE_TIMEOUT`` seconds, else
``--wait-per-job`` for each job before it (the holder included), then gives up in one line. A job
that disconnects frees the system, and so does a job that keeps the server waiting longer than
``--idle-limit`` (see below).

Authentication: client and server share a token and each proves it holds it (HMAC-SHA256 over
fresh nonces from both sides); the token itself never travels. Without TLS, batches, weights and
programs do travel in plaintext. See README.md, "Security", for what is and is not protected.

Options:

``--listen HOST:PORT``
    Address to listen on (default ``127.0.0.1:9000``; ``:9000`` is the default port when only a
    host is given; port 0 picks a free port, which is printed). A non-loopback address without
    ``--tls-cert`` starts with a one-line warning: the data would cross the network in plaintext.
``--device DEVICE``
    ``cpu`` (default), ``cuda`` or ``cuda:I``: where weights, optimizer state and compute live.
``--token-file PATH``
    File holding the shared secret (default ``~/.csrun/emulator.token``). Used when
    ``CSRUN_EMULATOR_TOKEN`` is unset. When the file does not exist, a fresh token (256 random
    bits) is generated with :mod:`secrets`, written there with mode 0600, and the path is
    printed. A token file its group or others can read or write is refused (exit 2): ``chmod 600``.
``--allow-weak-token``
    Serve with a token shorter than 16 characters or of low estimated entropy (repeated
    characters); refused otherwise (exit 2), because a recorded hello lets anyone test guesses
    of the token offline.
``--tls-cert PATH``, ``--tls-key PATH``
    Serve TLS (1.2 or later) with this PEM certificate chain and private key (both or neither);
    the key file must be private to its owner (``chmod 600``), else exit 2. Clients then need
    ``CSRUN_EMULATOR_CA``.
``--hello-deadline S``
    Seconds a new connection has for its whole hello, TLS handshake included, however slowly it
    sends (default 5); then it is closed. ``--hello-timeout`` is an older name for it.
``--max-pending N``
    Connections at once that have not authenticated yet (default 64). When all places are taken,
    a newcomer takes the place of the oldest one if that one has waited longer than
    min(1 s, deadline/2) (a real client authenticates in one round trip); otherwise the newcomer
    is told ``too many connections`` and its client retries within its connect timeout.
``--idle-limit S``
    Seconds the holder of the system may keep the server waiting for its next message (default
    60; ``0``: no limit). Time the server spends on the job's work does not count, and clients
    send keep-alives when they are quiet (compiling, running closures, evaluating), so only a
    client that is stopped or cut off reaches it. The system then goes to the next job, and the
    stalled client, if it wakes, is told in one line.
``--max-queued N``
    Jobs that may wait in the queue while another holds the system (default 32; ``0``: none,
    a job finding the system busy is refused at once). A queued job that disconnects, or sends
    nothing (not even its keep-alives) for ``--idle-limit`` seconds, leaves the queue and the
    jobs behind it move up. Only a job that authenticated is queued.
``--wait-per-job SECONDS``
    How long a queued job that sets no ``CSRUN_QUEUE_TIMEOUT`` of its own waits for each job
    before it, the holder included, counted from joining the queue (default 3600: a queue of
    real jobs of up to an hour each is waited through; ``0``: until its turn). Each job is told
    its limit in its queue line.
``--queue-depth N``
    Steps the server queues ahead of the one running (default 2).
``--max-header-bytes N`` (default 1 MiB), ``--max-tensors N`` (4096 per frame),
``--max-tensor-bytes N`` (1 GiB), ``--max-frame-bytes N`` (4 GiB of buffers per frame),
``--max-program-bytes N`` (2 GiB)
    Size limits on every frame field; a frame over any limit closes that connection.
``--log-level LEVEL``
    ``debug``, ``info`` (default), ``warning`` or ``error``; logs go to stderr.

Environment:

``CSRUN_EMULATOR_TOKEN``
    The token (takes precedence over ``--token-file``). Clients read the same variable, then
    the same token file (which they also refuse when others can read it).
``CSRUN_EMULATOR_CA``
    Read by clients: a PEM file of the CA(s) to trust; when set, the client speaks TLS and checks
    that the server's certificate names the host of ``--cs_ip`` (an IP address or DNS name).
``CSRUN_EMULATOR_TLS_NAME``
    Read by clients: the name the server's certificate must carry, when it is not the host of
    ``--cs_ip`` (for example a DNS name while connecting by IP address).
``CSRUN_QUEUE_TIMEOUT``
    Read by clients: seconds a job waits in the queue of a busy system before it gives up with
    one line naming the job it waited for and its position (``0``: not at all; unset: the
    server's ``--wait-per-job`` for each job before it).
``CSRUN_HALF_EMULATION``
    How programs in float16 / bfloat16 compute: ``rounding`` (the default on CPU: float32
    kernels with the values rounded where a 16-bit datapath rounds, see
    :mod:`csrun.emulator.engine.half_emulation`) or ``autocast`` (16-bit kernels; the default on CUDA).
``CSRUN_CUDA_GRAPH``
    ``auto`` (the default: on a CUDA device each step's forward and backward replay as a CUDA
    graph after 3 warm-up steps; float32 gives the same bits as without it, float16/bfloat16
    autocast may differ in the last bits, see :mod:`csrun.emulator.engine.cuda_graph`) or ``off``
    (every kernel launched one by one).
``CSRUN_ENGINE_TRACE``
    ``auto`` (the default: on a CPU, the program's forward runs as a checked TorchScript trace
    of the captured graph, the same numbers bit for bit, see
    :mod:`csrun.emulator.engine.traced_forward`) or ``off`` (the graph as captured).

Signals: SIGTERM and SIGINT stop the server cleanly (connections are closed, exit status 0).
Exit status: 0 after a clean stop, 2 for a bad option or value (an insecure token, token file or
key included), 1 if the address cannot be bound.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import math
import signal
import sys
import threading

import csrun
from csrun.env_settings import check_environment
from csrun.emulator.remote import wire
from csrun.emulator.remote.auth_token import (
    DEFAULT_TOKEN_FILE,
    TOKEN_ENV,
    check_token,
    server_token,
)
from csrun.emulator.remote.guard import GuardLimits
from csrun.emulator.remote.handshake import DEFAULT_WAIT_PER_JOB
from csrun.errors import ConfigError, UsageError, UserError
from csrun.help_style import Parser

PROG = "cs_emulator"


def _parser() -> argparse.ArgumentParser:
    d = wire.Limits()
    p = Parser(PROG, "Serve the wafer emulator over TCP: clients reach it with --cs_ip HOST:PORT and its token.",
               epilog="The manual (token, TLS, limits, environment): python -m pydoc csrun.cli.cs_emulator")
    p.add_argument("--listen", default="127.0.0.1:9000", metavar="HOST:PORT", help="where to listen (port 0: any free port)")
    p.add_argument("--device", default="cpu", metavar="DEVICE", help="cpu, cuda or cuda:I")
    p.add_argument("--token-file", default=DEFAULT_TOKEN_FILE, metavar="FILE",
                   help=f"the token; written (mode 0600) when missing and {TOKEN_ENV} is unset")
    p.add_argument("--allow-weak-token", action="store_true", help="serve with a short or repetitive token")
    p.add_argument("--tls-cert", metavar="FILE", help="PEM certificate chain: serve TLS (with --tls-key)")
    p.add_argument("--tls-key", metavar="FILE", help="PEM private key of --tls-cert (mode 0600)")
    g = GuardLimits()
    p.add_argument("--hello-deadline", "--hello-timeout", dest="hello_deadline", type=float, default=g.hello_deadline,
                   metavar="SECONDS", help="seconds for a connection's whole hello")
    p.add_argument("--max-pending", type=int, default=g.max_pending, metavar="N",
                   help="connections waiting to authenticate")
    p.add_argument("--idle-limit", type=float, default=g.idle_limit, metavar="SECONDS",
                   help="seconds the holder may keep the server waiting; 0: none")
    p.add_argument("--max-queued", type=int, default=g.max_queued, metavar="N",
                   help="jobs that may wait while the system is busy; 0: none")
    p.add_argument("--wait-per-job", type=float, default=DEFAULT_WAIT_PER_JOB, metavar="SECONDS",
                   help="seconds a queued job without CSRUN_QUEUE_TIMEOUT waits per job before it; 0: no limit")
    p.add_argument("--queue-depth", type=int, default=2, metavar="N", help="steps queued ahead")
    p.add_argument("--max-header-bytes", type=int, default=d.max_header_bytes, metavar="N",
                   help="largest message header a client may send")
    p.add_argument("--max-tensors", type=int, default=d.max_tensors, metavar="N", help="most tensors in one message")
    p.add_argument("--max-tensor-bytes", type=int, default=d.max_tensor_bytes, metavar="N", help="largest tensor")
    p.add_argument("--max-frame-bytes", type=int, default=d.max_frame_bytes, metavar="N", help="largest message")
    p.add_argument("--max-program-bytes", type=int, default=d.max_program_bytes, metavar="N",
                   help="largest compiled program a client may upload")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"), help="server log level")
    p.add_argument("--version", action="version", version=f"{PROG} (csrun {csrun.__version__})",
                   help="print the version and exit")
    return p


def _check_numbers(args: argparse.Namespace) -> None:
    """Refuse non-positive sizes and limits, naming the flag."""
    for name in ("queue_depth", "max_header_bytes", "max_tensors", "max_tensor_bytes", "max_frame_bytes",
                 "max_program_bytes", "max_pending"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if not args.hello_deadline > 0:
        raise UsageError(f"--hello-deadline must be > 0 seconds, got {args.hello_deadline:g}")
    if args.max_queued < 0:
        raise UsageError(f"--max-queued must be >= 0 (0: no queue), got {args.max_queued}")
    if not args.idle_limit >= 0:
        raise UsageError(f"--idle-limit must be >= 0 seconds (0: no limit), got {args.idle_limit:g}")
    if not 0 <= args.wait_per_job < math.inf:
        raise UsageError(f"--wait-per-job must be >= 0 seconds (0: no limit), got {args.wait_per_job:g}")
    if bool(args.tls_cert) != bool(args.tls_key):
        raise UsageError("--tls-cert and --tls-key go together: give both to serve TLS, or neither")


def _is_loopback(host: str) -> bool:
    """Whether the bound address ``host`` is reachable from this machine only."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv: list[str] | None = None) -> int:
    """Run the server until SIGTERM/SIGINT; returns the exit status."""
    from csrun.address import parse_address
    from csrun.emulator.remote.server import EmulatorServer

    try:
        check_environment()
        args = _parser().parse_args(argv)
    except (UsageError, ConfigError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s cs_emulator %(levelname)s %(message)s")
    try:
        host, port = parse_address(args.listen, allow_zero=True)
        _check_numbers(args)
        token, source, written = server_token(args.token_file)
        if not args.allow_weak_token:
            check_token(token, source)
        tls = None
        if args.tls_cert:
            from csrun.emulator.remote.tls import server_context

            tls = server_context(args.tls_cert, args.tls_key)
        limits = wire.Limits(max_header_bytes=args.max_header_bytes, max_tensors=args.max_tensors,
                             max_tensor_bytes=args.max_tensor_bytes, max_frame_bytes=args.max_frame_bytes,
                             max_program_bytes=args.max_program_bytes)
        guard = GuardLimits(max_pending=args.max_pending, hello_deadline=args.hello_deadline,
                            idle_limit=args.idle_limit, max_queued=args.max_queued)
        from csrun.emulator.engine.executor import parse_device

        parse_device(args.device)
        try:
            server = EmulatorServer(token=token, host=host, port=port, device=args.device,
                                    queue_depth=args.queue_depth, limits=limits, connection_limits=guard, tls=tls,
                                    wait_per_job=args.wait_per_job)
        except OSError as exc:
            print(f"{PROG}: error: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
            return 1
    except UserError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return exc.exit_code

    def stop(signum: int, _frame: object) -> None:
        logging.getLogger("csrun.emulator.remote.server").info("signal %d: stopping", signum)
        server.stopping = True

    previous = {}
    if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
        previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    if written:
        print(f"{PROG}: wrote a new token to {written} (mode 0600); clients read it from there or {TOKEN_ENV}",
              flush=True)
    bound = f"{server.address[0]}:{server.address[1]}"
    if tls is None and not _is_loopback(server.address[0]):
        print(f"{PROG}: warning: listening on {bound} without TLS: batches, weights and programs cross the "
              "network in plaintext and an on-path attacker can take over a session (the token itself is never "
              "sent); use --tls-cert/--tls-key", file=sys.stderr, flush=True)
    print(f"{PROG}: listening on {bound} (device {args.device}{', TLS' if tls else ''})", flush=True)
    try:
        server.serve_forever()
    finally:
        server.shutdown()
        for s, h in previous.items():
            signal.signal(s, h)
    try:
        print(f"{PROG}: stopped", flush=True)
    except BrokenPipeError:  # whoever read our stdout is gone (a job wrapper that ended first)
        pass
    return 0


def console_main() -> None:
    """Entry point of the ``cs_emulator`` console script."""
    sys.exit(main())


if __name__ == "__main__":
    console_main()
