"""cs_emulator under attack: what each attack does to a legitimate job, and how long until it trains.

Run from the repository root::

    python bench/emulator/server_attacks.py                  # server defaults, idle limit 10 s
    python bench/emulator/server_attacks.py --idle-limit 60  # the default idle limit too

A ``cs_emulator`` process is started on a free loopback port (``--hello-deadline``,
``--max-pending``, ``--idle-limit`` as given; the first two default to the server's defaults).
Each attack runs from this process; "time to recover" is the time from the attack being at full
strength (or the holder stalling) until a legitimate job holds the system; that job then loads a
program and trains 4 steps, and the row says whether it did. Printed as a markdown table
(RELIABILITY.md keeps the latest run).

Attacks: slow-loris (``--max-pending`` connections each trickling one byte of an unfinished
header every 5 s, coming back when cut); a connection flood (500 connections opened at once and
held silent); a wrong-token spray (8 threads of wrong-token hellos); a holder stopped with
SIGSTOP; a holder killed with SIGKILL; a passive observer of a whole session (a relaying proxy
that records every byte).
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from contextlib import suppress
from typing import Any, Callable

import torch
from torch import nn

from csrun.compiler.spec import OptimizerSpec, ProgramSpec
from csrun.emulator.remote import wire
from csrun.emulator.remote.client import RemoteDevice
from csrun.emulator.remote.errors import SystemBusy
from csrun.emulator.remote.guard import GuardLimits
from csrun.errors import UserError

STEPS = 4


class Tiny(nn.Module):
    """A small classifier whose forward(batch) returns the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2 = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.l2(torch.tanh(self.l1(x))), y)


def make_program() -> tuple[Any, ProgramSpec, list[tuple[torch.Tensor, torch.Tensor]]]:
    """An exported step, its spec and a few batches."""
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)) for _ in range(STEPS)]
    ep = torch.export.export(Tiny(), (batches[0],))
    spec = ProgramSpec(optimizer=OptimizerSpec(type="sgd", hyperparameters={}), learning_rate=0.01,
                       precision="float32")
    return ep, spec, batches


def start_server(token: str, args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    """A cs_emulator process on a free loopback port; returns it and its address."""
    env = dict(os.environ, CSRUN_EMULATOR_TOKEN=token)
    proc = subprocess.Popen([sys.executable, "-m", "csrun.cli.cs_emulator", "--listen", "127.0.0.1:0",
                             "--hello-deadline", str(args.hello_deadline), "--max-pending", str(args.max_pending),
                             "--idle-limit", str(args.idle_limit), "--log-level", "error"],
                            env=env, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout is not None else ""
    if "listening on " not in line:
        proc.kill()
        raise RuntimeError(f"cs_emulator did not start (printed {line!r})")
    return proc, line.split("listening on ")[1].split()[0]


def legit_job(address: str, token: str, program: tuple, job: str, timeout: float = 120.0) -> tuple[float, bool]:
    """Seconds until ``job`` holds the system (retrying while busy), and whether it then trained."""
    ep, spec, batches = program
    t0 = time.monotonic()
    while True:
        try:
            dev = RemoteDevice(address, token, job, connect_timeout=max(1.0, timeout - (time.monotonic() - t0)))
            break
        except SystemBusy:
            if time.monotonic() - t0 > timeout:
                return time.monotonic() - t0, False
            time.sleep(0.05)
    took = time.monotonic() - t0
    try:
        dev.load(ep, spec)
        losses = [h.result()["loss"].item() for h in [dev.submit(b) for b in batches]]
        return took, len(losses) == STEPS
    except Exception:  # noqa: BLE001 - a failed job is a figure here
        return took, False
    finally:
        dev.close()


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def slow_loris(address: str, token: str, program: tuple, n: int) -> tuple[str, str]:
    """``n`` connections trickling one header byte every 5 s, reconnecting when cut."""
    stop, cuts = threading.Event(), [0]

    def loris() -> None:
        while not stop.is_set():
            try:
                s = socket.create_connection(("127.0.0.1", _port(address)), timeout=10)
            except OSError:
                time.sleep(0.05)
                continue
            try:
                s.sendall(wire.MAGIC + struct.pack(">I", 4000))
                while not stop.wait(5.0):
                    s.sendall(b" ")
            except OSError:
                cuts[0] += 1
            finally:
                s.close()

    threads = [threading.Thread(target=loris, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    time.sleep(2.0)  # every place taken for a while
    times, ok = [], True
    for i in range(3):
        took, trained = legit_job(address, token, program, f"loris-{i}")
        times.append(took)
        ok &= trained
    t_cut = time.monotonic()
    base = cuts[0]
    time.sleep(6.0)
    rate = (cuts[0] - base) / (time.monotonic() - t_cut)
    stop.set()
    for t in threads:
        t.join(10)
    return (f"job {'trained' if ok else 'FAILED'}; trickling connections cut at the hello deadline "
            f"({rate:.1f} cuts/s) or evicted by newcomers", f"{statistics.median(times):.2f} s (median of 3 jobs)")


def flood(address: str, token: str, program: tuple, n: int = 500) -> tuple[str, str]:
    """``n`` connections opened at once and held silent."""
    socks = []
    for _ in range(n):
        with suppress(OSError):
            socks.append(socket.create_connection(("127.0.0.1", _port(address)), timeout=5))
    took, ok = legit_job(address, token, program, "after-flood")
    told = 0
    for s in socks:
        s.settimeout(0.5)
        with suppress(OSError, EOFError, wire.ProtocolError):
            head, _ = wire.recv_frame(s, wire.Limits())
            if head.get("kind") == "overload":
                told += 1
        s.close()
    return (f"job {'trained' if ok else 'FAILED'}; {told} of {len(socks)} flood connections told "
            f"\"too many connections\", the rest cut by eviction or the deadline", f"{took:.2f} s")


def wrong_tokens(address: str, token: str, program: tuple, threads: int = 8) -> tuple[str, str]:
    """``threads`` threads sending wrong-token hellos as fast as they can."""
    stop, refused = threading.Event(), [0]

    def spray() -> None:
        while not stop.is_set():
            with suppress(UserError, OSError):
                RemoteDevice(address, secrets.token_urlsafe(32), "guesser", connect_timeout=2).close()
            refused[0] += 1

    pool = [threading.Thread(target=spray, daemon=True) for _ in range(threads)]
    t0 = time.monotonic()
    for t in pool:
        t.start()
    time.sleep(1.0)
    took, ok = legit_job(address, token, program, "amid-guesses")
    stop.set()
    for t in pool:
        t.join(10)
    rate = refused[0] / (time.monotonic() - t0)
    return (f"job {'trained' if ok else 'FAILED'}; every guess refused ({rate:.0f} guesses/s over "
            f"{threads} threads; the token is 256 bits)", f"{took:.2f} s")


def _holder(address: str, token: str) -> subprocess.Popen:
    """A client process holding the system (see ``--holder``), once it has trained a step."""
    proc = subprocess.Popen([sys.executable, __file__, "--holder", address], env=dict(os.environ, CSRUN_EMULATOR_TOKEN=token),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if proc.stdout is None or proc.stdout.readline().strip() != "holding":
        proc.kill()
        raise RuntimeError("the holder process did not get the system")
    return proc


def stalled_holder(address: str, token: str, program: tuple) -> tuple[str, str]:
    """A holder stopped with SIGSTOP, then woken after the next job trained."""
    proc = _holder(address, token)
    os.kill(proc.pid, signal.SIGSTOP)
    took, ok = legit_job(address, token, program, "after-stall")
    os.kill(proc.pid, signal.SIGCONT)
    said = ""
    if proc.stdin is not None and proc.stdout is not None:
        proc.stdin.write("go\n")
        proc.stdin.flush()
        said = proc.stdout.readline().strip()
    proc.wait(30)
    return (f"system taken back at the idle limit; next job {'trained' if ok else 'FAILED'}; the woken "
            f"holder was told: `{said[:90]}...`", f"{took:.2f} s")


def killed_holder(address: str, token: str, program: tuple) -> tuple[str, str]:
    """A holder killed with SIGKILL."""
    proc = _holder(address, token)
    proc.kill()
    proc.wait()
    took, ok = legit_job(address, token, program, "after-kill")
    return f"connection closed by the kernel, system free; next job {'trained' if ok else 'FAILED'}", f"{took:.2f} s"


def observer(address: str, token: str, program: tuple) -> tuple[str, str]:
    """A relaying proxy records a whole session: hello, program upload, steps."""
    seen = bytearray()
    lsock = socket.create_server(("127.0.0.1", 0))

    def pump(src: socket.socket, dst: socket.socket) -> None:
        with suppress(OSError):
            while data := src.recv(65536):
                seen.extend(data)
                dst.sendall(data)
        with suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def relay() -> None:  # every connection the client makes (it retries while the system is busy)
        with suppress(OSError):
            while True:
                client, _ = lsock.accept()
                server = socket.create_connection(("127.0.0.1", _port(address)))
                threading.Thread(target=pump, args=(server, client), daemon=True).start()
                threading.Thread(target=pump, args=(client, server), daemon=True).start()

    threading.Thread(target=relay, daemon=True).start()
    took, ok = legit_job(f"127.0.0.1:{lsock.getsockname()[1]}", token, program, "observed")
    lsock.close()
    leaked = token.encode() in seen
    return (f"token on the wire: {'YES' if leaked else 'no'} ({len(seen)} bytes recorded; the hello carries "
            f"nonces and HMAC proofs); job {'trained' if ok else 'FAILED'}", "n/a (nothing to recover)")


def holder_main(address: str) -> int:
    """``--holder``: hold the system, say so, wait for a line on stdin, then try one more step."""
    ep, spec, batches = make_program()
    dev = RemoteDevice(address, os.environ["CSRUN_EMULATOR_TOKEN"], "holder", connect_timeout=30)
    dev.load(ep, spec)
    dev.submit(batches[0]).result()
    print("holding", flush=True)
    sys.stdin.readline()
    try:
        dev.submit(batches[1]).result()
        print("no error", flush=True)
    except Exception as exc:  # noqa: BLE001 - what the user would see
        print(f"{type(exc).__name__}: {exc}", flush=True)
    return 0


def main() -> int:
    """Run every attack against one server; print the table."""
    g = GuardLimits()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hello-deadline", type=float, default=g.hello_deadline)
    p.add_argument("--max-pending", type=int, default=g.max_pending)
    p.add_argument("--idle-limit", type=float, default=10.0)
    p.add_argument("--holder", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.holder:
        return holder_main(args.holder)
    token = secrets.token_urlsafe(32)
    program = make_program()
    proc, address = start_server(token, args)
    rows: list[tuple[str, Callable[[], tuple[str, str]]]] = [
        (f"slow-loris: {args.max_pending} connections, 1 byte / 5 s, back when cut",
         lambda: slow_loris(address, token, program, args.max_pending)),
        ("connection flood: 500 connections at once, held silent", lambda: flood(address, token, program)),
        ("wrong-token guesses from 8 threads", lambda: wrong_tokens(address, token, program)),
        ("holder stopped (SIGSTOP)", lambda: stalled_holder(address, token, program)),
        ("holder killed (SIGKILL)", lambda: killed_holder(address, token, program)),
        ("passive observer records a session", lambda: observer(address, token, program)),
    ]
    try:
        print(f"cs_emulator --hello-deadline {args.hello_deadline:g} --max-pending {args.max_pending} "
              f"--idle-limit {args.idle_limit:g} (loopback, this machine: {os.cpu_count()} cores)\n")
        print("| attack | behaviour | time to recover |")
        print("|---|---|---|")
        for name, run in rows:
            behaviour, recover = run()
            print(f"| {name} | {behaviour} | {recover} |", flush=True)
        alive = proc.poll() is None
        print(f"\nserver still running after all attacks: {'yes' if alive else 'NO'}")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
