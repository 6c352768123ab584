"""One authenticated client's session: requests in, answers out, on a fresh device.

The reader (the connection's thread) decodes each request and runs it on an
:class:`~csrun.emulator.embedded.EmbeddedDevice` of the session's own; a responder thread sends
the answers in request order as they resolve, so steps pipeline. ``ping`` frames are read and
dropped: they only show that the client is alive. The socket is a
:class:`~csrun.emulator.remote.guard.WatchedSocket`, so the server's watchdog knows how long the session
has been waiting for the client; over the idle limit it calls :meth:`Session.reclaim`, which
tells the client why (when its socket can take one more frame) and cuts the connection. However
the session ends, its device is closed and its state dropped.
"""

from __future__ import annotations

import logging
import queue
import select
import socket
import threading
from typing import Any, Callable

import torch

from csrun.emulator.remote import wire
from csrun.emulator.embedded import EmbeddedDevice
from csrun.emulator.remote.errors import ProtocolError
from csrun.program.errors import DeviceError, StepFailed
from csrun.emulator.remote.guard import WatchedSocket, cut
from csrun.emulator.remote.program import load_program
from csrun.program.step_plan import StepPlan
from csrun.errors import UserError
from csrun.program.spec import ProgramSpec

log = logging.getLogger("csrun.emulator.remote.server")


def _error_header(seq: int | None, exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, UserError):
        kind = "user"
    elif isinstance(exc, ProtocolError):
        kind = "protocol"
    else:
        kind = "device"
    head: dict[str, Any] = {"op": "error", "seq": seq, "kind": kind, "message": str(exc)}
    if isinstance(exc, StepFailed):
        head["step"] = exc.step
    return head


class Session:
    """One authenticated client: reads requests, runs them on a fresh device, answers in order."""

    def __init__(self, conn: socket.socket, peer: str, job_id: str, *, device: str, queue_depth: int,
                 limits: wire.Limits, idle_limit: float, stopping: Callable[[], bool]) -> None:
        """Serve ``job_id`` at ``peer`` over ``conn`` on a fresh ``device``; :meth:`run` until it ends."""
        self.conn = conn
        self.link = WatchedSocket(conn)
        self.peer = peer
        self.job_id = job_id
        self.limits = limits
        self.idle_limit = idle_limit
        self.stopping = stopping
        self.reclaimed: str | None = None
        """Why the system was taken back from this client (None while it was not)."""
        self.device = EmbeddedDevice(device=device, queue_depth=queue_depth,
                                     notice=lambda m: log.warning("job %s: %s", job_id, m))
        self.answers: "queue.Queue[Any]" = queue.Queue()
        self.send_lock = threading.Lock()
        self.responder = threading.Thread(target=self._respond, name="cs-emulator-respond", daemon=True)

    def _send(self, header: dict[str, Any], tensors: list[torch.Tensor] | None = None) -> None:
        with self.send_lock:
            wire.send_frame(self.link, header, tensors)

    # liveness (see csrun.emulator.remote.guard.Holder) ---------------------------------------------------

    def idle_for(self) -> float | None:
        """Seconds the server has been waiting for this client's next bytes (None: not waiting)."""
        return self.link.idle_for()

    def reclaim(self, idle: float) -> None:
        """Take the system back after ``idle`` silent seconds: say why if the socket takes it, then cut."""
        self.reclaimed = (f"job {self.job_id} sent nothing for {idle:.1f}s, over this system's idle limit of "
                          f"{self.idle_limit:g}s: the system was taken back and the job's device state dropped")
        log.warning("job %s (%s): %s", self.job_id, self.peer, self.reclaimed)
        if self.send_lock.acquire(timeout=0.2):  # not while an answer is stuck on a full socket
            try:
                if select.select([], [self.conn], [], 0)[1]:
                    wire.send_frame(self.conn, {"op": "error", "seq": None, "kind": "idle", "message": self.reclaimed})
            except (OSError, ValueError):
                pass
            finally:
                self.send_lock.release()
        cut(self.conn)

    def _respond(self) -> None:
        while True:
            item = self.answers.get()
            if item is None:
                return
            kind, seq, payload = item
            try:
                if kind == "step":
                    try:
                        out = payload.result()
                        tensors: list[torch.Tensor] = []
                        self._send({"op": "result", "seq": seq, "outputs": wire.encode(out, tensors)}, tensors)
                    except (UserError, DeviceError) as exc:
                        self._send(_error_header(seq, exc))
                elif kind == "state":
                    tensors = []
                    self._send({"op": "result", "seq": seq, "state": wire.encode(payload, tensors)}, tensors)
                elif kind == "ok":
                    self._send({"op": "ok", "seq": seq})
                else:  # error
                    self._send(_error_header(seq, payload))
            except OSError:
                return  # the reader sees the broken connection and ends the session

    def _handle(self, header: dict[str, Any], tensors: list[torch.Tensor]) -> bool:
        """Run one request; False ends the session."""
        op = header.get("op")
        if op == "ping":
            return True  # a keep-alive: receiving it was the point
        seq = header.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool):
            raise ProtocolError(f"request {op!r} without an integer seq")
        try:
            if op == "step":
                batch = wire.decode(header.get("batch"), tensors)
                plan = StepPlan.from_json(header.get("plan"))
                self.answers.put(("step", seq, self.device.submit(batch, plan)))
            elif op == "load":
                spec_text = header.get("spec")
                if not isinstance(spec_text, str):
                    raise ProtocolError("load without a spec")
                try:
                    spec = ProgramSpec.from_json(spec_text)
                except Exception as exc:  # noqa: BLE001 - any malformed spec is the user's
                    raise UserError(f"program spec is malformed ({type(exc).__name__}: {exc})") from None
                if tensors[0].dtype != torch.uint8 or tensors[0].dim() != 1:
                    raise ProtocolError("the program archive must travel as one 1-d uint8 buffer")
                program = load_program(tensors[0].numpy().tobytes())
                self.device.load(program, spec)
                self.answers.put(("ok", seq, None))
            elif op == "state_dict":
                self.answers.put(("state", seq, self.device.state_dict()))
            elif op == "load_state_dict":
                state = wire.decode(header.get("state"), tensors)
                if not isinstance(state, dict):
                    raise ProtocolError("load_state_dict without a state mapping")
                self.device.load_state_dict(state, strict=bool(header.get("strict", True)),
                                            load_optimizer=bool(header.get("load_optimizer", True)))
                self.answers.put(("ok", seq, None))
            elif op == "sync":
                self.device.synchronize()
                self.answers.put(("ok", seq, None))
            elif op == "bye":
                return False
            else:
                raise ProtocolError(f"unknown request {op!r}")
        except (UserError, DeviceError) as exc:
            self.answers.put(("error", seq, exc))
        return True

    def run(self) -> None:
        """Serve requests until the client leaves, the link breaks or input is malformed."""
        self.responder.start()
        try:
            while not self.stopping():
                header, tensors = wire.recv_frame(self.link, self.limits)
                if not self._handle(header, tensors):
                    log.info("job %s (%s) said goodbye", self.job_id, self.peer)
                    break
        except (EOFError, OSError) as exc:
            if self.reclaimed is None:
                log.info("job %s (%s): connection lost (%s)", self.job_id, self.peer, exc or type(exc).__name__)
        except ProtocolError as exc:
            log.warning("job %s (%s): closing the connection: %s", self.job_id, self.peer, exc)
            self.answers.put(("error", None, exc))
        except Exception as exc:  # noqa: BLE001 - never take the server down
            log.exception("job %s (%s): closing the connection after an internal error", self.job_id, self.peer)
            self.answers.put(("error", None, DeviceError(f"internal error: {type(exc).__name__}: {exc}")))
        finally:
            self.answers.put(None)
            self.device.close()
            self.responder.join(timeout=10)
