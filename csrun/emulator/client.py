"""The client side of the link: :class:`RemoteDevice` drives a ``cs_emulator`` server.

It has the same interface as :class:`~csrun.emulator.embedded.EmbeddedDevice`. Steps are
pipelined: ``submit`` sends the batch at once and returns a handle; a reader thread resolves
handles as results arrive. Up to ``queue_depth`` steps are in flight.
"""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import Future
from typing import Any

import torch

from csrun.address import Address, parse_address
from csrun.compiler.spec import ProgramSpec
from csrun.emulator import wire
from csrun.emulator.device import Device
from csrun.emulator.errors import (
    AuthenticationFailed,
    DeviceError,
    LinkLost,
    ProtocolError,
    SpecError,
    StepFailed,
    SystemBusy,
    SystemUnreachable,
)
from csrun.emulator.handles import StepHandle
from csrun.emulator.program import save_program
from csrun.errors import UserError

def _error_from(header: dict[str, Any]) -> BaseException:
    kind = header.get("kind")
    msg = str(header.get("message", "unknown error"))
    if kind == "user":
        return SpecError(msg)
    if kind == "busy":
        return SystemBusy(msg)
    if kind == "auth":
        return AuthenticationFailed(msg)
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
        limits: wire.Limits = wire.Limits(),
    ) -> None:
        """Connect (retrying for up to ``connect_timeout`` seconds) and authenticate.

        Raises :class:`SystemUnreachable`, :class:`AuthenticationFailed` or :class:`SystemBusy`.
        """
        if not isinstance(queue_depth, int) or queue_depth < 1:
            raise UserError(f"queue_depth must be a positive integer, got {queue_depth!r}")
        self.host, self.port = parse_address(address)
        self.limits = limits
        self.queue_depth = queue_depth
        self._sock = self._connect(connect_timeout)
        self._send_lock = threading.Lock()
        self._pending: dict[int, tuple[str, Future[Any]]] = {}
        self._pending_lock = threading.Lock()
        self._slots = threading.Semaphore(queue_depth)
        self._seq = 0
        self._submitted = 0
        self._error: BaseException | None = None
        self._closed = False
        self._last_step = 0
        try:
            self._sock.settimeout(max(connect_timeout, 10.0))
            wire.send_frame(self._sock, {"op": "hello", "token": token, "job_id": str(job_id),
                                         "version": wire.PROTOCOL_VERSION})
            header, _ = wire.recv_frame(self._sock, limits)
            if header.get("op") != "ok":
                raise _error_from(header)
            self._sock.settimeout(None)
        except (OSError, EOFError, ProtocolError) as exc:
            self._sock.close()
            raise SystemUnreachable(f"the system at {self.where} closed the connection during the hello ({exc})") from None
        except BaseException:
            self._sock.close()
            raise
        self._reader = threading.Thread(target=self._read, name="cs-emulator-link", daemon=True)
        self._reader.start()

    @property
    def where(self) -> str:
        """``host:port`` (``[v6]:port``) of the system."""
        return str(Address(self.host, self.port))

    def _connect(self, timeout: float) -> socket.socket:
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            try:
                sock = socket.create_connection((self.host, self.port), timeout=max(1.0, min(5.0, timeout)))
                wire.tune_socket(sock)
                return sock
            except OSError:
                if time.monotonic() + delay > deadline:
                    raise SystemUnreachable(
                        f"could not reach the system at {self.where} (is cs_emulator running there?)"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    # link ------------------------------------------------------------------------------------

    def _fail_all(self, err: BaseException) -> None:
        if self._error is None:
            self._error = err
        with self._pending_lock:
            pending, self._pending = self._pending, {}
        for _, fut in pending.values():
            if not fut.done():
                fut.set_exception(err)

    def _read(self) -> None:
        try:
            while True:
                header, tensors = wire.recv_frame(self._sock, self.limits, max_tensor_bytes=self.limits.max_frame_bytes)
                seq = header.get("seq")
                with self._pending_lock:
                    entry = self._pending.pop(seq, None) if isinstance(seq, int) else None
                if header.get("op") == "error":
                    err = _error_from(header)
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
                self._fail_all(LinkLost(f"lost the connection to the system at {self.where} ({type(exc).__name__}: {exc})"))

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
                err = LinkLost(f"lost the connection to the system at {self.where} ({exc})")
                self._fail_all(err)
                raise err from None
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

    def submit(self, batch: Any) -> StepHandle:
        """Send one step; returns at once unless ``queue_depth`` steps are in flight."""
        self._raise_if_failed()
        self._slots.acquire()
        tensors: list[torch.Tensor] = []
        try:
            encoded = wire.encode(batch, tensors)
            fut = self._request("step", {"op": "step", "batch": encoded}, tensors)
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
        try:
            with self._send_lock:
                wire.send_frame(self._sock, {"op": "bye", "seq": 0})
        except OSError:
            pass
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._reader.join(timeout=5)
