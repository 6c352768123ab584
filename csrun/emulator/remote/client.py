"""The client side of the link: :class:`RemoteDevice` drives a ``cs_emulator`` server.

It has the same interface as :class:`~csrun.emulator.embedded.EmbeddedDevice`. Steps are
pipelined: ``submit`` sends the batch at once and returns a handle; a reader thread resolves
handles as results arrive. Up to ``queue_depth`` steps are in flight.

The link is opened by :mod:`csrun.emulator.remote.connect` (TLS when ``CSRUN_EMULATOR_CA`` is set, see
:mod:`csrun.emulator.remote.tls`; the token is proven, never sent); a system busy with another job
is waited for in its queue, up to ``CSRUN_QUEUE_TIMEOUT``, with one line per queue position. While it is open, a keep-alive thread
(:mod:`csrun.emulator.remote.keepalive`) pings when the job is quiet, so only a process stopped as a
whole outlives the server's idle limit; such a job, when it wakes, gets one line saying that the
system was taken back (:class:`~csrun.emulator.errors.SystemReclaimed`). A device still open when
the interpreter exits is closed first (a goodbye to the server, the link's threads ended): left to
the interpreter's end, a thread still reading could take the process down with SIGABRT.
"""

from __future__ import annotations

import atexit
import socket
import threading
from concurrent.futures import Future
from typing import Any

import torch

from csrun.address import Address, parse_address
from csrun.emulator.remote import wire
from csrun.emulator.remote.connect import open_link
from csrun.emulator.device import Device
from csrun.emulator.remote.errors import ProtocolError
from csrun.program.errors import SpecError
from csrun.program.errors import DeviceError, LinkLost, StepFailed, SystemReclaimed
from csrun.emulator.handles import StepHandle
from csrun.program.step_plan import FULL_STEP, StepPlan
from csrun.emulator.remote.keepalive import PING, KeepAlive
from csrun.emulator.remote.program import save_program
from csrun.emulator.remote.tls import ClientTLS, client_tls_from_env
from csrun.errors import UserError
from csrun.program.spec import ProgramSpec

LOST_WAIT = 1.0
"""Seconds a failed send waits for the reader to learn why the link ended (the server's last word)."""
BYE_WAIT_S = 2.0
"""How long :meth:`RemoteDevice.close` waits to send its goodbye (a stalled server gets none)."""


def _error_from(header: dict[str, Any], where: str) -> BaseException:
    kind = header.get("kind")
    msg = str(header.get("message", "unknown error"))
    if kind == "user":
        return SpecError(msg)
    if kind == "idle":
        return SystemReclaimed(f"the system at {where} dropped this job: {msg}")
    if kind == "device" and isinstance(header.get("step"), int):
        err = StepFailed(header["step"], "")
        err.args = (msg,)
        return err
    return DeviceError(msg)


class RemoteDevice(Device):
    """A device served by ``cs_emulator`` at ``address`` (``HOST[:PORT]``, port 9000 by default)."""

    def __init__(
        self,
        address: str,
        token: str,
        job_id: str,
        *,
        queue_depth: int = 2,
        connect_timeout: float = 30.0,
        queue_timeout: float | None = None,
        limits: wire.Limits = wire.Limits(),
        tls: ClientTLS | None = None,
    ) -> None:
        """Connect (retrying for up to ``connect_timeout`` seconds) and authenticate; a system busy
        with another job is waited for in its queue for up to ``queue_timeout`` seconds (None:
        ``CSRUN_QUEUE_TIMEOUT``), one logged line per position (:mod:`csrun.emulator.remote.connect`).

        ``tls``: how to wrap the connection; None reads ``CSRUN_EMULATOR_CA`` (plain TCP when unset).
        Raises :class:`SystemUnreachable`, :class:`AuthenticationFailed`, :class:`SystemBusy`
        (:class:`TooManyConnections` and :class:`QueueTimeout` among them) or :class:`VersionMismatch`.
        """
        if not isinstance(queue_depth, int) or queue_depth < 1:
            raise UserError(f"queue_depth must be a positive integer, got {queue_depth!r}")
        self.host, self.port = parse_address(address)
        self.limits = limits
        self.queue_depth = queue_depth
        link = open_link(self.host, self.port, token, str(job_id), timeout=connect_timeout,
                         tls=tls if tls is not None else client_tls_from_env(), wait=queue_timeout)
        self._sock = link.sock
        self.idle_limit = link.idle_limit
        """The server's idle limit in seconds (0: none); the keep-alives stay well inside it."""
        self._send_lock = threading.Lock()
        self._pending: dict[int, tuple[str, Future[Any]]] = {}
        self._pending_lock = threading.Lock()
        self._slots = threading.Semaphore(queue_depth)
        self._seq = 0
        self._submitted = 0
        self._error: BaseException | None = None
        self._closed = False
        self._last_step = 0
        self._keepalive = KeepAlive(link.idle_limit / 4, self._ping) if link.idle_limit else None
        self._reader = threading.Thread(target=self._read, name="cs-emulator-link", daemon=True)
        self._reader.start()
        if self._keepalive is not None:
            self._keepalive.start()
        atexit.register(self.close)  # a script that never closes its device: its link threads end before the interpreter does

    @property
    def where(self) -> str:
        """``host:port`` (``[v6]:port``) of the system."""
        return str(Address(self.host, self.port))

    # link ------------------------------------------------------------------------------------

    def _fail_all(self, err: BaseException) -> None:
        if self._error is None:
            self._error = err
        with self._pending_lock:
            pending, self._pending = self._pending, {}
        for _, fut in pending.values():
            if not fut.done():
                fut.set_exception(err)

    def _lost(self, exc: BaseException) -> LinkLost:
        """The error for a link that ended without the server's word (EOF, reset)."""
        msg = f"lost the connection to the system at {self.where} ({type(exc).__name__}: {exc})"
        if self._keepalive is not None and self._keepalive.stalled_for() > self.idle_limit:
            return SystemReclaimed(
                f"the system at {self.where} dropped this job: this process sent nothing for "
                f"{self._keepalive.stalled_for():.0f}s (was it stopped?), over the system's idle limit of "
                f"{self.idle_limit:g}s, so the system was given back ({type(exc).__name__})")
        return LinkLost(msg)

    def _read(self) -> None:
        try:
            while True:
                header, tensors = wire.recv_frame(self._sock, self.limits, max_tensor_bytes=self.limits.max_frame_bytes)
                seq = header.get("seq")
                with self._pending_lock:
                    entry = self._pending.pop(seq, None) if isinstance(seq, int) else None
                if header.get("op") == "error":
                    err = _error_from(header, self.where)
                    if entry is None:  # a connection-level error: everything fails
                        self._fail_all(err)
                        return
                    if entry[0] == "step" and self._error is None:
                        self._error = err  # a failed step poisons the device; a refused request does not
                    entry[1].set_exception(err)
                    continue
                if entry is None:
                    raise ProtocolError(f"answer for unknown request {seq!r}")
                kind, fut = entry
                if kind == "step":
                    out = wire.decode(header.get("outputs"), tensors)
                    if isinstance(out, dict) and "global_step" in out:
                        self._last_step = int(out["global_step"])
                    fut.set_result(out)
                elif kind == "state":
                    fut.set_result(wire.decode(header.get("state"), tensors))
                else:
                    fut.set_result(None)
        except BaseException as exc:  # noqa: BLE001 - turn any link failure into LinkLost
            if self._closed:
                self._fail_all(DeviceError("the device is closed"))
            else:
                self._fail_all(self._lost(exc))
        finally:
            if self._keepalive is not None:
                self._keepalive.stop()

    def _ping(self) -> bool:
        """One keep-alive unless a send is in progress; False once the link is gone."""
        if self._closed or self._error is not None:
            return False
        if not self._send_lock.acquire(blocking=False):
            return True
        try:
            wire.send_frame(self._sock, PING)
            if self._keepalive is not None:
                self._keepalive.sent()
            return True
        except OSError:
            return False  # the reader reports why the link ended
        finally:
            self._send_lock.release()

    def _request(self, kind: str, header: dict[str, Any], tensors: list[torch.Tensor] | None = None) -> "Future[Any]":
        self._raise_if_failed()
        fut: "Future[Any]" = Future()
        with self._send_lock:
            self._seq += 1
            header = dict(header, seq=self._seq)
            with self._pending_lock:
                self._pending[self._seq] = (kind, fut)
            try:
                wire.send_frame(self._sock, header, tensors)
            except OSError as exc:
                self._reader.join(LOST_WAIT)  # the server may have said why it closed the link
                err = self._error if self._error is not None else self._lost(exc)
                self._fail_all(err)
                raise err from None
            if self._keepalive is not None:
                self._keepalive.sent()
        return fut

    def _raise_if_failed(self) -> None:
        if self._closed:
            raise DeviceError("the device is closed")
        if self._error is not None:
            raise self._error

    # Device ----------------------------------------------------------------------------------

    def load(self, program: torch.export.ExportedProgram, spec: ProgramSpec) -> None:
        """Upload the program archive and spec; waits until the system has built it."""
        data = save_program(program)
        if len(data) > self.limits.max_program_bytes:
            raise UserError(f"program archive of {len(data)} bytes is over the link's limit "
                            f"of {self.limits.max_program_bytes}")
        blob = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        self._request("ok", {"op": "load", "spec": spec.to_json()}, [blob]).result()

    def submit(self, batch: Any, plan: StepPlan = FULL_STEP) -> StepHandle:
        """Send one step; returns at once unless ``queue_depth`` steps are in flight."""
        self._raise_if_failed()
        self._slots.acquire()
        tensors: list[torch.Tensor] = []
        try:
            encoded = wire.encode(batch, tensors)
            header: dict[str, Any] = {"op": "step", "batch": encoded}
            if plan != FULL_STEP:
                header["plan"] = plan.to_json()
            fut = self._request("step", header, tensors)
        except BaseException:
            self._slots.release()
            raise
        fut.add_done_callback(lambda _f: self._slots.release())
        self._submitted += 1
        return StepHandle(self._submitted, fut)

    def state_dict(self) -> dict[str, Any]:
        """Fetch the full device state (CPU tensors) after all submitted steps."""
        return self._request("state", {"op": "state_dict"}).result()

    def load_state_dict(self, state: dict[str, Any], *, strict: bool = True, load_optimizer: bool = True) -> None:
        """Send a state to the device (after all submitted steps)."""
        tensors: list[torch.Tensor] = []
        encoded = wire.encode(state, tensors)
        self._request("ok", {"op": "load_state_dict", "state": encoded, "strict": strict,
                             "load_optimizer": load_optimizer}, tensors).result()

    def synchronize(self) -> None:
        """Wait for all submitted steps; raise the first error."""
        self._request("ok", {"op": "sync"}).result()

    @property
    def global_step(self) -> int:
        """Global step after the steps whose results arrived."""
        return self._last_step

    def close(self) -> None:
        """Say goodbye and close the link; pending steps are abandoned."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        if self._keepalive is not None:
            self._keepalive.stop()
        try:  # bounded: a sender stuck on a stalled server must not hold the process (at exit too)
            if self._send_lock.acquire(timeout=BYE_WAIT_S):
                try:
                    self._sock.settimeout(BYE_WAIT_S)
                    wire.send_frame(self._sock, {"op": "bye", "seq": 0})
                finally:
                    self._send_lock.release()
        except OSError:
            pass
        try:
            socket.socket.shutdown(self._sock, socket.SHUT_RDWR)  # under TLS too, without unwrapping
        except OSError:
            pass
        self._sock.close()
        self._reader.join(timeout=5)
