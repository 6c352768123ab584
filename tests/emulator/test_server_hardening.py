"""The cs_emulator server against hostile and stalled clients (issue 11 items 3-5).

Slow-loris connections, a flood over the pending limit, a holder that stops (SIGSTOP) or goes
silent, what travels on the wire (via a recording proxy), wrong tokens and impostor servers,
protocol versions, TLS, and the command's refusals of weak tokens, readable secret files and
plaintext on a public address. Limits are set short here so that each test takes seconds, yet
long enough that a legitimate client on a busy machine (its threads waiting a second or more for
a core) stays inside them; a limit is checked by what it cuts, waited for, never by a time taken.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from csrun.emulator.remote import handshake, wire
from csrun.cli.cs_emulator import main as cli_main
from csrun.emulator.remote.client import RemoteDevice
from csrun.emulator.remote.errors import AuthenticationFailed, SystemBusy, SystemUnreachable, TooManyConnections, VersionMismatch
from csrun.emulator.remote.server import EmulatorServer
from csrun.emulator.remote.tls import ClientTLS, client_context, server_context

from tests.tiny_models import MLP, mlp_batches
from . import helpers
from .helpers import addr, make_program, raw_hello

TOKEN = "hardening-Zq8v3Xk1-token-7Rp2Lm"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def program() -> tuple:
    batches = mlp_batches(4)
    ep, spec = make_program(MLP(), batches[0])
    return ep, spec, batches


def serve(*, token: str = TOKEN, tls: Any = None, **guard: Any) -> contextlib.AbstractContextManager[EmulatorServer]:
    """A server on a free loopback port with this file's token and the given connection limits."""
    return helpers.serve(token=token, tls=tls, **guard)


def train(address: str, program: tuple, job: str, **kw: Any) -> list[float]:
    """Connect, load and train every batch; the losses."""
    ep, spec, batches = program
    with RemoteDevice(address, kw.pop("token", TOKEN), job, **kw) as dev:
        dev.load(ep, spec)
        return [h.result()["loss"].item() for h in [dev.submit(b) for b in batches]]


def wait_until(cond: Any, timeout: float) -> float:
    """Seconds until ``cond()`` held; fails after ``timeout``."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"condition not met within {timeout}s")
        time.sleep(0.02)
    return time.monotonic() - t0


# slow-loris and floods ---------------------------------------------------------------------------


def _loris(port: int, stop: threading.Event, cuts: list[int]) -> None:
    """Hold a connection in its hello by trickling a header byte every 0.2 s; reconnect when cut."""
    while not stop.is_set():
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
        except OSError:
            time.sleep(0.01)
            continue
        try:
            s.sendall(wire.MAGIC + struct.pack(">I", 4000))  # a header is announced...
            while not stop.wait(0.2):
                s.sendall(b" ")  # ...and never finished
        except OSError:
            cuts.append(1)  # cut by the server: come straight back
        finally:
            s.close()


def test_slow_loris_does_not_lock_a_job_out(program: tuple) -> None:
    """The legitimate job is told "too many connections" (and retries) until a loris is older than the
    eviction age, then takes its place; its own hello has the 3 s deadline, a busy machine's margin."""
    with serve(max_pending=8, hello_deadline=3.0) as srv:
        stop, cuts = threading.Event(), []
        lorises = [threading.Thread(target=_loris, args=(srv.address[1], stop, cuts)) for _ in range(8)]
        for t in lorises:
            t.start()
        try:
            wait_until(lambda: srv.guard.pending == 8, 60)  # every place taken
            losses = train(addr(srv), program, "legit-under-attack", connect_timeout=60)
            wait_until(lambda: cuts, 60)  # trickling does not buy more than the hello deadline
        finally:
            stop.set()
            for t in lorises:
                t.join()
    assert len(losses) == len(program[2])


def test_over_the_pending_limit_a_client_hears_too_many_connections(program: tuple) -> None:
    with serve(max_pending=4, hello_deadline=30, evict_after=30) as srv:
        waiting = [socket.create_connection(("127.0.0.1", srv.address[1]), timeout=5) for _ in range(4)]
        for s in waiting:  # each was admitted and greeted
            assert wire.recv_frame(s, wire.Limits())[0]["op"] == "challenge"
        with pytest.raises(TooManyConnections) as err:
            RemoteDevice(addr(srv), TOKEN, "late-job", connect_timeout=0.3)
        msg = str(err.value)
        assert "too many connections" in msg and addr(srv) in msg and "\n" not in msg
        assert "reset" not in msg
        for s in waiting:
            s.close()
        wait_until(lambda: srv.guard.pending == 0, 60)
        assert len(train(addr(srv), program, "after-the-flood", connect_timeout=10)) == len(program[2])


def test_hello_deadline_cuts_a_connection_that_never_answers() -> None:
    with serve(hello_deadline=0.5) as srv:
        s = socket.create_connection(("127.0.0.1", srv.address[1]), timeout=60)
        assert wire.recv_frame(s, wire.Limits())[0]["op"] == "challenge"
        wait_until(lambda: srv.guard.pending == 0, 60)  # cut (the only way off the table for a silent one)
        with pytest.raises((EOFError, OSError)):
            wire.recv_frame(s, wire.Limits())
        s.close()


# stalled holders ---------------------------------------------------------------------------------

ONE_STEP = textwrap.dedent("""
    import sys
    from csrun.emulator.remote.client import RemoteDevice
    from tests.emulator.helpers import make_program
    from tests.tiny_models import MLP, mlp_batches
    batches = mlp_batches(2)
    ep, spec = make_program(MLP(), batches[0])
    dev = RemoteDevice(sys.argv[1], sys.argv[2], sys.argv[3], connect_timeout=10)
    dev.load(ep, spec)
    dev.submit(batches[0]).result()
""")
"""A client (argv: address, token, job id) that trains one step and keeps its device open."""
STALLED = ONE_STEP + textwrap.dedent("""
    print("ready", flush=True)
    sys.stdin.readline()
    try:
        dev.submit(batches[1]).result()
        print("no error", flush=True)
    except Exception as exc:
        print(f"{type(exc).__name__}: {exc}", flush=True)
""")


def test_stopped_holder_loses_the_system_and_is_told_when_it_wakes(program: tuple) -> None:
    with serve(idle_limit=3.0) as srv:
        proc = subprocess.Popen([sys.executable, "-c", STALLED, addr(srv), TOKEN, "stalled-job"], cwd=REPO,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None and proc.stdin is not None
            assert proc.stdout.readline().strip() == "ready"
            time.sleep(4.0)  # quiet but alive: its keep-alives hold the system past the limit
            assert srv.busy_with is not None and srv.busy_with[0] == "stalled-job"
            os.kill(proc.pid, signal.SIGSTOP)
            wait_until(lambda: srv.busy_with is None, 60)
            assert len(train(addr(srv), program, "next-job", connect_timeout=10)) == len(program[2])
            os.kill(proc.pid, signal.SIGCONT)
            proc.stdin.write("go\n")
            proc.stdin.flush()
            said = proc.stdout.readline().strip()
            assert proc.wait(30) == 0, proc.stderr.read() if proc.stderr else ""
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
    assert said.startswith("SystemReclaimed: "), said
    assert addr(srv) in said and "idle limit of 3s" in said


def test_a_script_that_never_closes_its_device_says_goodbye_at_exit(caplog: pytest.LogCaptureFixture) -> None:
    """The device is closed before the interpreter ends (its link threads, left running into the
    interpreter's end, once took a client down with SIGABRT): exit 0 and a goodbye, not a lost link."""
    caplog.set_level(logging.INFO, logger="csrun.emulator.remote.server")
    with serve() as srv:
        done = subprocess.run([sys.executable, "-c", ONE_STEP, addr(srv), TOKEN, "unclosed-job"], cwd=REPO, capture_output=True,
                              text=True, timeout=600)  # a deadline for a hang only: torch's import on a busy machine
        wait_until(lambda: srv.busy_with is None, 60)
    assert done.returncode == 0, done.stderr
    said = [r.getMessage() for r in caplog.records if "unclosed-job" in r.getMessage()]
    assert any("said goodbye" in line for line in said) and not any("connection lost" in line for line in said), said


def test_silent_authenticated_socket_loses_the_system(program: tuple) -> None:
    with serve(idle_limit=2.0) as srv:
        s = socket.create_connection(("127.0.0.1", srv.address[1]), timeout=60)
        assert raw_hello(s, TOKEN, "silent")["op"] == "ok"  # then nothing: no requests, no keep-alives
        assert srv.busy_with is not None
        wait_until(lambda: srv.busy_with is None, 60)
        last_word, _ = wire.recv_frame(s, wire.Limits())
        s.close()
        assert last_word["kind"] == "idle" and "idle limit of 2s" in last_word["message"]
        assert len(train(addr(srv), program, "next-job", connect_timeout=10)) == len(program[2])


def test_a_quiet_client_keeps_the_system_with_keepalives(program: tuple) -> None:
    ep, spec, batches = program
    with serve(idle_limit=2.5) as srv:
        with RemoteDevice(addr(srv), TOKEN, "thinker", connect_timeout=10) as dev:
            assert dev.idle_limit == 2.5
            dev.load(ep, spec)
            dev.submit(batches[0]).result()
            time.sleep(6.0)  # compiling, closures, evaluation: much longer than the idle limit
            assert [dev.submit(b).result()["loss"].dim() for b in batches[1:]] == [0] * (len(batches) - 1)


# what is on the wire -----------------------------------------------------------------------------


class Proxy:
    """A TCP relay to ``target`` that records what each side sent."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.up = bytearray()  # client -> server
        self.down = bytearray()  # server -> client
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(client, server, self.up), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, self.down), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, record: bytearray) -> None:
        try:
            while data := src.recv(65536):
                record.extend(data)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                dst.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.sock.close()


def test_the_token_never_travels(program: tuple) -> None:
    with serve() as srv:
        proxy = Proxy(("127.0.0.1", srv.address[1]))
        try:
            assert len(train(proxy.address, program, "watched-job", connect_timeout=10)) == len(program[2])
        finally:
            proxy.close()
    assert b'"op":"hello"' in proxy.up and b'"proof"' in proxy.up  # the hello went through the proxy
    for seen in (bytes(proxy.up), bytes(proxy.down)):
        assert TOKEN.encode() not in seen
        assert TOKEN.encode().hex().encode() not in seen


def test_wrong_token_is_refused_and_the_server_goes_on(program: tuple, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="csrun.emulator.remote.server")
    with serve() as srv:
        with pytest.raises(AuthenticationFailed) as err:
            RemoteDevice(addr(srv), "not-the-token-but-long-enough", "intruder", connect_timeout=5)
        assert "the token does not match" in str(err.value) and addr(srv) in str(err.value)
        assert srv.busy_with is None
        assert len(train(addr(srv), program, "rightful", connect_timeout=10)) == len(program[2])
    assert any("authentication failed" in r.getMessage() for r in caplog.records)


def test_a_flood_of_wrong_tokens_writes_a_bounded_log(caplog: pytest.LogCaptureFixture) -> None:
    """30 wrong-token guesses in a burst: the first few are logged, the rest counted, not written."""
    caplog.set_level(logging.WARNING, logger="csrun.emulator.remote.server")
    with serve() as srv:
        for i in range(30):
            with pytest.raises(AuthenticationFailed):
                RemoteDevice(addr(srv), "not-the-token-but-long-enough", f"guess{i}", connect_timeout=5)
    lines = [r.getMessage() for r in caplog.records if "authentication failed" in r.getMessage()]
    assert len(lines) == srv.warnings.burst  # then at most one per every_s seconds (the flood took less)


@contextlib.contextmanager
def fake_server(answer: Any) -> Iterator[tuple[str, list[dict]]]:
    """A listener that speaks the hello as ``answer(conn, heard)`` says; yields its address and what it heard."""
    lsock = socket.create_server(("127.0.0.1", 0))
    heard: list[dict] = []

    def run() -> None:
        with contextlib.suppress(OSError, EOFError):
            conn, _ = lsock.accept()
            with conn:
                answer(conn, heard)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    try:
        yield f"127.0.0.1:{lsock.getsockname()[1]}", heard
    finally:
        lsock.close()
        t.join(5)


def test_a_server_that_cannot_prove_the_token_is_not_trusted() -> None:
    def impostor(conn: socket.socket, heard: list[dict]) -> None:
        wire.send_frame(conn, handshake.greeting(handshake.new_nonce()))
        heard.append(wire.recv_frame(conn, wire.Limits())[0])
        wire.send_frame(conn, {"op": "ok", "seq": None, "version": wire.PROTOCOL_VERSION, "proof": "00" * 32,
                               "idle_limit": 60})
        with contextlib.suppress(OSError, EOFError):
            wire.recv_frame(conn, wire.Limits())

    with fake_server(impostor) as (where, heard):
        with pytest.raises(AuthenticationFailed, match=f"the system at {where} did not prove that it holds the token"):
            RemoteDevice(where, TOKEN, "cautious", connect_timeout=5)
    assert heard and TOKEN not in str(heard[0])


def test_protocol_versions_are_named_on_both_sides() -> None:
    with serve() as srv:  # a protocol-1 client: sends its hello at once, reads one frame
        s = socket.create_connection(("127.0.0.1", srv.address[1]), timeout=5)
        wire.send_frame(s, {"op": "hello", "token": TOKEN, "job_id": "old", "version": 1})
        greeting, _ = wire.recv_frame(s, wire.Limits())
        assert "wire protocol 2" in greeting["message"] and "use the same csrun version" in greeting["message"]
        refusal, _ = wire.recv_frame(s, wire.Limits())
        assert refusal["kind"] == "version" and "the client 1" in refusal["message"]
        s.close()

    def future_server(conn: socket.socket, heard: list[dict]) -> None:
        wire.send_frame(conn, dict(handshake.greeting(handshake.new_nonce()), version=3))
        with contextlib.suppress(OSError, EOFError):
            wire.recv_frame(conn, wire.Limits())

    with fake_server(future_server) as (where, _):
        with pytest.raises(VersionMismatch, match=rf"the system at {where} speaks wire protocol 3, this client 2"):
            RemoteDevice(where, TOKEN, "old-client", connect_timeout=5)


# TLS -------------------------------------------------------------------------------------------


def _self_signed(folder: Path, name: str) -> tuple[Path, Path]:
    cert, key = folder / f"{name}.crt", folder / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"], check=True, capture_output=True)
    key.chmod(0o600)
    return cert, key


needs_openssl = pytest.mark.skipif(shutil.which("openssl") is None, reason="the openssl command is not installed")


@needs_openssl
def test_tls_round_trip(tmp_path: Path, program: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = _self_signed(tmp_path, "server")
    other, _ = _self_signed(tmp_path, "other")
    with serve(tls=server_context(str(cert), str(key)), hello_deadline=5.0) as srv:
        proxy = Proxy(("127.0.0.1", srv.address[1]))
        try:
            monkeypatch.setenv("CSRUN_EMULATOR_CA", str(cert))  # the way jobs are told
            assert len(train(proxy.address, program, "tls-job", connect_timeout=10)) == len(program[2])
        finally:
            proxy.close()
        assert b'"op"' not in proxy.up and b'"op"' not in proxy.down  # nothing readable crossed
        monkeypatch.delenv("CSRUN_EMULATOR_CA")
        with pytest.raises(AuthenticationFailed, match=f"the system at {addr(srv)} presented a certificate"):
            RemoteDevice(addr(srv), TOKEN, "wrong-ca", connect_timeout=5, tls=ClientTLS(client_context(str(other))))
        with pytest.raises(SystemUnreachable, match="closed the connection before greeting.*CSRUN_EMULATOR_CA"):
            RemoteDevice(addr(srv), TOKEN, "plain-client", connect_timeout=5)
    with serve() as plain:
        with pytest.raises(SystemUnreachable, match=f"the TLS handshake with the system at {addr(plain)} failed"):
            RemoteDevice(addr(plain), TOKEN, "tls-client", connect_timeout=5, tls=ClientTLS(client_context(str(cert))))


# the command's refusals and warnings -----------------------------------------------------------


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = cli_main(argv)
    out = capsys.readouterr()
    assert "Traceback" not in out.err + out.out
    return rc, out.err.strip()


@pytest.mark.parametrize("token, reason", [("short-token", "is 11 characters long; at least 16 are needed"),
                                            ("ab" * 12, "repeats its characters too much")])
def test_cli_refuses_a_weak_token(token: str, reason: str, capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CSRUN_EMULATOR_TOKEN", token)
    rc, err = _cli(["--listen", "127.0.0.1:0"], capsys)
    assert rc == 2 and err.count("\n") == 0, err
    assert err.startswith("cs_emulator: error: the token from CSRUN_EMULATOR_TOKEN ") and reason in err
    assert "--allow-weak-token" in err


def test_cli_refuses_readable_secret_files(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CSRUN_EMULATOR_TOKEN", raising=False)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o644)
    rc, err = _cli(["--listen", "127.0.0.1:0", "--token-file", str(token_file)], capsys)
    assert rc == 2 and err.count("\n") == 0, err
    assert f"the token file {token_file} is readable or writable by its group or others (mode 0644)" in err
    assert f"chmod 600 {token_file}" in err
    token_file.chmod(0o600)
    key = tmp_path / "key.pem"
    key.write_text("not really a key\n")
    key.chmod(0o640)
    rc, err = _cli(["--listen", "127.0.0.1:0", "--token-file", str(token_file), "--tls-cert", str(token_file),
                    "--tls-key", str(key)], capsys)
    assert rc == 2 and err.count("\n") == 0 and "the TLS key" in err and "mode 0640" in err, err
    rc, err = _cli(["--listen", "127.0.0.1:0", "--tls-cert", str(token_file)], capsys)
    assert rc == 2 and "--tls-cert and --tls-key go together" in err


def test_cli_warns_about_plaintext_on_a_public_address(tmp_path: Path) -> None:
    env = dict(os.environ, CSRUN_EMULATOR_TOKEN="weak")
    proc = subprocess.Popen([sys.executable, "-m", "csrun.cli.cs_emulator", "--listen", "0.0.0.0:0",
                             "--allow-weak-token", "--log-level", "warning"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert "listening on 0.0.0.0:" in proc.stdout.readline()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    warnings = [line for line in err.splitlines() if line.startswith("cs_emulator: warning:")]
    assert len(warnings) == 1 and "0.0.0.0:" in warnings[0] and "without TLS" in warnings[0]
    assert "--tls-cert" in warnings[0] and "Traceback" not in err


def test_busy_is_still_busy(program: tuple) -> None:
    with serve(max_queued=0) as srv:  # no queue (tests/emulator/test_server_queue.py): refused at once
        with RemoteDevice(addr(srv), TOKEN, "first", connect_timeout=5):
            with pytest.raises(SystemBusy, match=rf"system busy: in use by job first since .*, and this system queues "
                                                 rf"no jobs .* \(the system at {addr(srv)}\)"):
                RemoteDevice(addr(srv), TOKEN, "second", connect_timeout=5)
