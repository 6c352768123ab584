"""The cs_emulator queue (issue 33 item 10): jobs that find the system busy wait in a bounded FIFO
queue, are told their position, the jobs ahead and when their turn is expected (one line per
change), and are admitted in turn; a job waits its own limit, else the system's allowance for each
job before it (issue 45 item 7).

Each test runs its own server on a free loopback port; timeouts are small values set here.
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import threading
import time
from typing import Any

import pytest

from csrun.emulator.remote import handshake, wire
from csrun.emulator.remote.client import RemoteDevice
from csrun.emulator.remote.errors import AuthenticationFailed, QueueTimeout, SystemBusy
from csrun.emulator.remote.server import EmulatorServer
from csrun.errors import UserError

from tests.tiny_models import MLP, mlp_batches
from . import helpers
from .helpers import addr, make_program, raw_hello

TOKEN = "queue-Hq7v2Xk9-token-3Rp8Lm"
CLIENT_LOG = "csrun.emulator.remote.client"


@pytest.fixture(scope="module")
def program() -> tuple:
    batches = mlp_batches(3)
    ep, spec = make_program(MLP(), batches[0])
    return ep, spec, batches


def serve(*, token: str = TOKEN, tls: Any = None, **guard: Any) -> contextlib.AbstractContextManager[EmulatorServer]:
    """A server on a free loopback port with this file's token and the given connection limits."""
    return helpers.serve(token=token, tls=tls, **guard)


def wait_until(cond: Any, timeout: float = 120) -> None:
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"condition not met within {timeout}s")
        time.sleep(0.01)


def train(dev: RemoteDevice, program: tuple) -> list[float]:
    ep, spec, batches = program
    dev.load(ep, spec)
    return [h.result()["loss"].item() for h in [dev.submit(b) for b in batches]]


class Job(threading.Thread):
    """A job on a thread of its own (named ``job-<name>``, so its log lines can be told apart):
    connects (queueing if need be), trains (unless ``program`` is None), holds the system ``hold``
    seconds more, records the order of admission, its losses and how long it waited for the system."""

    def __init__(self, srv: EmulatorServer, name: str, program: tuple | None, admitted: list[str], *,
                 hold: float = 0.0, **kw: Any) -> None:
        super().__init__(name=f"job-{name}", daemon=True)
        self.srv, self.job, self.program, self.admitted, self.kw = srv, name, program, admitted, kw
        self.hold = hold
        self.losses: list[float] | None = None
        self.error: BaseException | None = None
        self.waited: float | None = None

    def run(self) -> None:
        try:
            asked = time.monotonic()
            with RemoteDevice(addr(self.srv), TOKEN, self.job, connect_timeout=10, **self.kw) as dev:
                self.waited = time.monotonic() - asked
                self.admitted.append(self.job)
                if self.program is not None:
                    self.losses = train(dev, self.program)
                time.sleep(self.hold)  # the job's own length (its keep-alives hold the system)
        except BaseException as exc:  # noqa: BLE001 - the test looks at it
            self.error = exc


def said(caplog: pytest.LogCaptureFixture, job: str) -> list[str]:
    """The queue lines the client of ``job`` logged."""
    return [r.getMessage() for r in caplog.records if r.name == CLIENT_LOG and r.threadName == f"job-{job}"]


def raw_queued(srv: EmulatorServer, job: str) -> tuple[socket.socket, dict[str, Any]]:
    """A raw connection that authenticates as ``job`` and is queued (it never pings)."""
    s = socket.create_connection(("127.0.0.1", srv.address[1]), timeout=10)
    return s, raw_hello(s, TOKEN, job)


def next_frame(s: socket.socket) -> dict[str, Any]:
    return wire.recv_frame(s, wire.Limits())[0]


def test_queued_jobs_get_their_positions_and_are_admitted_in_order(program: tuple,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    admitted: list[str] = []
    with serve() as srv:
        with RemoteDevice(addr(srv), TOKEN, "A", connect_timeout=10) as holder:
            losses_a = train(holder, program)
            jobs = {}
            for name in ("B", "C"):
                jobs[name] = Job(srv, name, program, admitted, queue_timeout=60)
                jobs[name].start()
                wait_until(lambda: name in srv.queued)
            assert srv.queued == ["B", "C"]
            assert admitted == []  # nobody overtook the holder
        for job in jobs.values():
            job.join(60)
            assert job.error is None, job.error
        wait_until(lambda: srv.busy_with is None)
        assert srv.queued == []
    assert admitted == ["B", "C"]
    where = addr(srv)
    unknown = "expected wait unknown (no job has finished on this system yet)"
    own = "this job waits up to 60 s (CSRUN_QUEUE_TIMEOUT)"
    assert said(caplog, "B") == [f"cs_emulator at {where} is busy with job A; queued at position 1; {unknown}; {own}"]
    first, second = said(caplog, "C")
    assert first == (f"cs_emulator at {where} is busy with job A; queued at position 2, after 1 queued job (B); "
                     f"{unknown}; {own}")
    assert re.fullmatch(rf"cs_emulator at {where} is busy with job B; queued at position 1; expected wait [0-9.]+ s "
                        rf"\(a job here takes [0-9.]+ s\); {re.escape(own)}", second), second  # A finished: timed
    # each job trained for real, on a fresh device: the same losses as the holder's
    assert jobs["B"].losses == losses_a and jobs["C"].losses == losses_a


def test_a_queue_longer_than_the_allowance_per_job_is_waited_through(program: tuple, caplog: pytest.LogCaptureFixture,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A job that sets no limit of its own waits ``--wait-per-job`` for each job before it, from joining:
    three jobs queue behind a holder, each job holding the system 2 s of an allowance of 5 s (a busy
    machine's margin: the jobs only connect and hold), so the last waits 6 s or more in all, past the
    allowance (a limit of that many seconds counted from joining, as ``CSRUN_QUEUE_TIMEOUT``'s 600 s
    was, would have given up on it), and every job gets the system in turn."""
    caplog.set_level(logging.INFO)
    monkeypatch.delenv("CSRUN_QUEUE_TIMEOUT", raising=False)
    admitted: list[str] = []
    with serve(wait_per_job=5.0) as srv:
        with RemoteDevice(addr(srv), TOKEN, "A", connect_timeout=10):
            jobs = [Job(srv, name, None, admitted, hold=2.0) for name in "BCD"]
            for job in jobs:
                job.start()
                wait_until(lambda: job.job in srv.queued)
            time.sleep(2.0)  # the holder's own length, as each job's
        for job in jobs:
            job.join(120)
            assert job.error is None, job.error
    assert admitted == ["B", "C", "D"]
    last = jobs[-1]
    assert last.waited is not None and last.waited > 5.0  # A's 2 s and B's and C's: over one allowance
    lines = said(caplog, "D")
    where = addr(srv)
    limit = "this job waits up to 15 s (5 s per job before it: cs_emulator --wait-per-job)"  # 3 jobs before it
    assert lines[0] == (f"cs_emulator at {where} is busy with job A; queued at position 3, after 2 queued jobs "
                        f"(B, C); expected wait unknown (no job has finished on this system yet); {limit}")
    assert re.fullmatch(rf"cs_emulator at {where} is busy with job B; queued at position 2, after 1 queued job "
                        rf"\(C\); expected wait [0-9.]+ s \(a job here takes [0-9.]+ s\); {re.escape(limit)}",
                        lines[1]), lines[1]
    assert len(lines) == 3 and lines[2].startswith(f"cs_emulator at {where} is busy with job C; queued at position 1;")


def test_the_expected_wait_is_what_is_left_of_the_holders_time_and_a_job_time_for_each_job_ahead(
        program: tuple) -> None:
    """Measured from the jobs that finished: after one job held the system 1 s or more, a job
    queued second behind a new holder expects the rest of that holder's time plus one job's."""
    with serve() as srv:
        with RemoteDevice(addr(srv), TOKEN, "A", connect_timeout=10):
            time.sleep(1.0)  # A's length
        wait_until(lambda: srv.busy_with is None)
        with RemoteDevice(addr(srv), TOKEN, "B", connect_timeout=10):
            c, first = raw_queued(srv, "C")
            d, second = raw_queued(srv, "D")
            assert first["jobs_ahead"] == [] and second["jobs_ahead"] == ["C"]
            assert first["job_time"] >= 1.0 and second["job_time"] == first["job_time"]  # A's, the one that finished
            assert 0 <= first["expected_wait"] <= first["job_time"]  # what is left of B's, at A's length
            # D's: one job's time more, less what B held meanwhile (both rounded to 0.1 s)
            assert first["job_time"] - 0.1 <= second["expected_wait"] <= first["expected_wait"] + first["job_time"] + 0.1
            assert first["wait_per_job"] == second["wait_per_job"] == 3600.0  # the default allowance
            c.close()
            d.close()


def test_a_full_queue_refuses_in_one_line_naming_its_size(program: tuple, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with serve(max_queued=1) as srv:
        with RemoteDevice(addr(srv), TOKEN, "A", connect_timeout=10):
            b, frame = raw_queued(srv, "B")
            assert frame["op"] == "queued" and frame["position"] == 1 and frame["busy_with"] == "A"
            with pytest.raises(SystemBusy) as err:
                RemoteDevice(addr(srv), TOKEN, "C", connect_timeout=10, queue_timeout=30)
            assert srv.queued == ["B"]
            b.close()
    msg = str(err.value)
    assert "\n" not in msg and not isinstance(err.value, QueueTimeout)
    assert msg.startswith("system busy: in use by job A since ")
    assert "its queue is full (1 job waiting, the most it queues: cs_emulator --max-queued)" in msg
    assert f"(the system at {addr(srv)})" in msg
    assert not [r for r in caplog.records if r.name == CLIENT_LOG and "job C" in r.getMessage()]


def test_no_queue_refuses_at_once(program: tuple) -> None:
    with serve(max_queued=0) as srv:
        with RemoteDevice(addr(srv), TOKEN, "first", connect_timeout=10):
            with pytest.raises(SystemBusy, match=r"^system busy: in use by job first since .*, and this system "
                                                 r"queues no jobs \(cs_emulator --max-queued 0\)"):
                RemoteDevice(addr(srv), TOKEN, "second", connect_timeout=10, queue_timeout=30)
        assert srv.queued == []


def test_a_queue_timeout_is_one_line_and_the_next_job_moves_up(program: tuple, caplog: pytest.LogCaptureFixture,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.INFO)
    monkeypatch.setenv("CSRUN_QUEUE_TIMEOUT", "2")  # the knob, as a job would set it
    with serve() as srv:
        with RemoteDevice(addr(srv), TOKEN, "A", connect_timeout=10):
            admitted: list[str] = []
            impatient = Job(srv, "B", program, admitted)
            impatient.start()
            wait_until(lambda: srv.queued == ["B"])
            c, frame = raw_queued(srv, "C")
            assert frame["op"] == "queued" and frame["position"] == 2 and frame["ahead"] == 1
            impatient.join(30)
            moved = next_frame(c)  # B gave up: C is next
            assert moved["op"] == "queued" and moved["position"] == 1 and moved["busy_with"] == "A"
            assert srv.queued == ["C"]
            c.close()
    err = impatient.error
    assert isinstance(err, QueueTimeout) and isinstance(err, UserError) and err.exit_code == 1
    assert str(err) == (f"cs_emulator at {addr(srv)} is still busy with job A: this job waited 2 s in its queue "
                        "and was at position 1; CSRUN_QUEUE_TIMEOUT sets how long to wait")
    assert admitted == []
    assert any("job B (" in r.getMessage() and "left the queue" in r.getMessage() for r in caplog.records)


def test_a_queued_client_that_disconnects_lets_the_others_move_up(program: tuple) -> None:
    with serve() as srv:
        with RemoteDevice(addr(srv), TOKEN, "A", connect_timeout=10):
            waiting = {}
            for i, name in enumerate("BCD", start=1):
                waiting[name], frame = raw_queued(srv, name)
                assert (frame["op"], frame["position"], frame["ahead"]) == ("queued", i, i - 1)
            waiting["B"].close()  # gone without a word
            assert (next_frame(waiting["C"])["position"], next_frame(waiting["D"])["position"]) == (1, 2)
            assert srv.queued == ["C", "D"]
        answer = next_frame(waiting["C"])  # the holder left: C's hello is answered
        assert answer["op"] == "ok" and srv.busy_with is not None and srv.busy_with[0] == "C"
        moved = next_frame(waiting["D"])
        assert (moved["position"], moved["busy_with"]) == (1, "C")
        waiting["C"].close()
        assert next_frame(waiting["D"])["op"] == "ok"
        waiting["D"].close()
        wait_until(lambda: srv.busy_with is None)


def test_a_queue_that_does_not_move_wakes_nobody(program: tuple) -> None:
    """Queued connections sleep in select: over a second of a still queue, no waiter's thread turns."""
    with serve() as srv:
        with RemoteDevice(addr(srv), TOKEN, "A", connect_timeout=10):
            socks = [raw_queued(srv, f"Q{i}")[0] for i in range(5)]
            wait_until(lambda: len(srv.queued) == 5)
            time.sleep(0.2)  # each waiter has sent its frame and gone to sleep
            before = [w.turns for w in srv._queue]
            time.sleep(1.0)
            assert [w.turns for w in srv._queue] == before
            for s in socks:
                s.close()
            wait_until(lambda: srv.queued == [])


def test_a_silent_queued_client_is_dropped_at_the_idle_limit(program: tuple) -> None:
    with serve(idle_limit=2.0) as srv:
        with RemoteDevice(addr(srv), TOKEN, "A", connect_timeout=10):  # its keep-alives hold the system
            silent, frame = raw_queued(srv, "mute")
            assert frame["op"] == "queued" and frame["idle_limit"] == 2.0
            last = next_frame(silent)
            assert last["op"] == "error" and last["kind"] == "idle"
            assert "while queued, over this system's idle limit of 2s" in last["message"]
            assert srv.queued == []
            silent.close()
            admitted: list[str] = []
            patient = Job(srv, "pinger", program, admitted, queue_timeout=30)
            patient.start()
            wait_until(lambda: srv.queued == ["pinger"])
            time.sleep(5.0)  # two and a half idle limits: its pings keep its place (2 s: a pause of a second
            # or more on a busy machine must not look like silence)
            assert srv.queued == ["pinger"]
        patient.join(60)
        assert patient.error is None and admitted == ["pinger"]


def test_only_authenticated_clients_of_this_protocol_are_queued(program: tuple) -> None:
    with serve() as srv:
        with RemoteDevice(addr(srv), TOKEN, "A", connect_timeout=10):
            with pytest.raises(AuthenticationFailed):
                RemoteDevice(addr(srv), "not-the-token-but-long-enough", "intruder", connect_timeout=10,
                             queue_timeout=30)
            s = socket.create_connection(("127.0.0.1", srv.address[1]), timeout=10)
            greeting = next_frame(s)
            wire.send_frame(s, dict(handshake.hello(TOKEN.encode(), greeting["nonce"], "future"), version=99))
            assert next_frame(s)["kind"] == "version"
            s.close()
            # a client of protocol 2 from before the queue (no "queue" in its hello) hears busy, as it did
            s = socket.create_connection(("127.0.0.1", srv.address[1]), timeout=10)
            greeting = next_frame(s)
            wire.send_frame(s, handshake.hello(TOKEN.encode(), greeting["nonce"], "older", queue=False))
            answer = next_frame(s)
            assert answer["kind"] == "busy" and answer["message"].startswith("system busy: in use by job A since ")
            assert "queue" not in answer["message"]
            s.close()
            assert srv.queued == []


def test_an_impostor_cannot_keep_a_client_queued() -> None:
    lsock = socket.create_server(("127.0.0.1", 0))

    def impostor() -> None:
        with contextlib.suppress(OSError, EOFError):
            conn, _ = lsock.accept()
            with conn:
                wire.send_frame(conn, handshake.greeting(handshake.new_nonce()))
                wire.recv_frame(conn, wire.Limits())
                wire.send_frame(conn, handshake.queued(1, "ghost", "now", 32, 0, "00" * 32))
                wire.recv_frame(conn, wire.Limits())

    t = threading.Thread(target=impostor, daemon=True)
    t.start()
    where = f"127.0.0.1:{lsock.getsockname()[1]}"
    try:
        with pytest.raises(AuthenticationFailed, match=f"the system at {where} did not prove that it holds the token"):
            RemoteDevice(where, TOKEN, "cautious", connect_timeout=5, queue_timeout=30)
    finally:
        lsock.close()
        t.join(5)


def test_twenty_simultaneous_clients_all_complete_without_a_retry_loop(program: tuple) -> None:
    admitted: list[str] = []
    with serve() as srv:
        jobs = [Job(srv, f"j{i:02d}", program, admitted, queue_timeout=120) for i in range(20)]
        for job in jobs:
            job.start()
        for job in jobs:
            job.join(180)
    errors = [f"{job.job}: {type(job.error).__name__}: {job.error}" for job in jobs if job.error is not None]
    assert errors == []
    assert sorted(admitted) == sorted(job.job for job in jobs)
    assert all(job.losses is not None and len(job.losses) == len(program[2]) for job in jobs)
