"""The emulator server: one authenticated client at a time drives an EmbeddedDevice over TCP.

Session protocol (frames as in :mod:`csrun.emulator.wire`; every request after ``hello`` carries
a ``seq`` and is answered in order):

===================  ===========================================  ==================================
request ``op``       fields / buffers                             answer
===================  ===========================================  ==================================
``hello``            ``token``, ``job_id``, ``version`` (first)   ``ok`` or ``error`` (auth / busy)
``load``             ``spec`` (ProgramSpec JSON); 1 buffer:       ``ok``
                     the ``torch.export`` archive
``step``             ``batch`` (encoded pytree) + buffers         ``result`` with ``outputs``
``state_dict``       --                                           ``result`` with ``state``
``load_state_dict``  ``state``, ``strict``, ``load_optimizer``    ``ok``
``sync``             --                                           ``ok``
``bye``              --                                           (connection closes)
===================  ===========================================  ==================================

Errors come back as ``{"op": "error", "seq", "kind": "user"|"device"|"protocol"|"auth"|"busy",
"message", "step"?}``. The token is compared with ``hmac.compare_digest``. While a client holds
the system, other authenticated clients get ``system busy: in use by job J since T`` and are
closed. A client that disconnects (or whose connection breaks) frees the system at once; its
device state is dropped. Malformed input closes only that connection, with a logged reason.
"""

from __future__ import annotations

import datetime as _dt
import hmac
import logging
import queue
import socket
import threading
import time
from typing import Any

import torch

from csrun.compiler.spec import ProgramSpec
from csrun.emulator import wire
from csrun.emulator.embedded import EmbeddedDevice
from csrun.emulator.errors import DeviceError, ProtocolError, StepFailed
from csrun.emulator.program import load_program
from csrun.errors import UserError

log = logging.getLogger("csrun.emulator.server")

PROTOCOL_VERSION = wire.PROTOCOL_VERSION
MAX_ID_CHARS = 256


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


class _Session:
    """One authenticated client: reads requests, runs them on a fresh device, answers in order."""

    def __init__(self, server: "EmulatorServer", conn: socket.socket, peer: str, job_id: str) -> None:
        self.server = server
        self.conn = conn
        self.peer = peer
        self.job_id = job_id
        self.device = EmbeddedDevice(device=server.device, queue_depth=server.queue_depth,
                                     notice=lambda m: log.warning("job %s: %s", job_id, m))
        self.answers: "queue.Queue[Any]" = queue.Queue()
        self.responder = threading.Thread(target=self._respond, name="cs-emulator-respond", daemon=True)

    def _send(self, header: dict[str, Any], tensors: list[torch.Tensor] | None = None) -> None:
        wire.send_frame(self.conn, header, tensors)

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
        seq = header.get("seq")
        if not isinstance(seq, int) or isinstance(seq, bool):
            raise ProtocolError(f"request {op!r} without an integer seq")
        try:
            if op == "step":
                batch = wire.decode(header.get("batch"), tensors)
                self.answers.put(("step", seq, self.device.submit(batch)))
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
            while not self.server.stopping:
                header, tensors = wire.recv_frame(self.conn, self.server.limits)
                if not self._handle(header, tensors):
                    log.info("job %s (%s) said goodbye", self.job_id, self.peer)
                    break
        except EOFError:
            log.info("job %s (%s) disconnected", self.job_id, self.peer)
        except ProtocolError as exc:
            log.warning("job %s (%s): closing the connection: %s", self.job_id, self.peer, exc)
            self.answers.put(("error", None, exc))
        except OSError as exc:
            log.info("job %s (%s): connection lost (%s)", self.job_id, self.peer, exc)
        except Exception as exc:  # noqa: BLE001 - never take the server down
            log.exception("job %s (%s): closing the connection after an internal error", self.job_id, self.peer)
            self.answers.put(("error", None, DeviceError(f"internal error: {type(exc).__name__}: {exc}")))
        finally:
            self.answers.put(None)
            self.device.close()
            self.responder.join(timeout=10)


class EmulatorServer:
    """A ``cs_emulator`` server bound to ``host:port`` (port 0 picks a free one)."""

    def __init__(
        self,
        *,
        token: str,
        host: str = "127.0.0.1",
        port: int = 9000,
        device: str = "cpu",
        queue_depth: int = 2,
        limits: wire.Limits = wire.Limits(),
        hello_timeout: float = 10.0,
        max_connections: int = 64,
    ) -> None:
        """Bind the listening socket. ``token`` must be non-empty. At most ``max_connections``
        connections are open at once (the rest are closed on accept); each has ``hello_timeout``
        seconds to authenticate."""
        if not token:
            raise UserError("the emulator needs a non-empty token")
        self._token = token.encode()
        self.device = device
        self.queue_depth = queue_depth
        self.limits = limits
        self.hello_timeout = hello_timeout
        self.stopping = False
        self._lock = threading.Lock()
        self._active: tuple[str, str] | None = None  # (job id, since)
        self._conns: set[socket.socket] = set()
        self._slots = threading.Semaphore(max_connections)
        self._threads: list[threading.Thread] = []
        self._sock = socket.create_server((host, port), reuse_port=False)
        self._sock.settimeout(0.2)
        self.address: tuple[str, int] = self._sock.getsockname()[:2]

    @property
    def busy_with(self) -> tuple[str, str] | None:
        """(job id, since) of the client holding the system, or None."""
        return self._active

    def serve_forever(self) -> None:
        """Accept connections until :meth:`shutdown`."""
        log.info("listening on %s:%d (device %s)", self.address[0], self.address[1], self.device)
        while not self.stopping:
            try:
                conn, addr = self._sock.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError as exc:
                if self.stopping:
                    break
                log.warning("accept failed (%s); retrying", exc)  # e.g. out of file descriptors
                time.sleep(0.1)
                continue
            peer = f"{addr[0]}:{addr[1]}"
            if not self._slots.acquire(blocking=False):
                log.warning("%s: too many connections, closing", peer)
                conn.close()
                continue
            t = threading.Thread(target=self._serve_conn, args=(conn, peer), name="cs-emulator-conn", daemon=True)
            self._threads = [x for x in self._threads if x.is_alive()]
            self._threads.append(t)
            t.start()
        self._sock.close()

    def start(self) -> threading.Thread:
        """Serve on a background thread (tests, embedding); returns the thread."""
        t = threading.Thread(target=self.serve_forever, name="cs-emulator-accept", daemon=True)
        t.start()
        return t

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop accepting, drop every connection, wait for their threads."""
        self.stopping = True
        try:
            self._sock.close()
        except OSError:
            pass
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in list(self._threads):
            t.join(timeout)

    def _hello(self, conn: socket.socket, peer: str) -> str | None:
        """Authenticate; returns the job id, or None after answering and logging a refusal."""
        header, _ = wire.recv_frame(conn, wire.Limits(max_header_bytes=min(self.limits.max_header_bytes, 64 << 10),
                                                      max_tensors=0))
        if header.get("op") != "hello":
            raise ProtocolError("the first frame must be hello")
        token = header.get("token")
        if not isinstance(token, str) or not hmac.compare_digest(token.encode(), self._token):
            log.warning("%s: authentication failed (wrong or missing token)", peer)
            wire.send_frame(conn, {"op": "error", "seq": None, "kind": "auth",
                                   "message": "authentication failed: the token does not match this system's"})
            return None
        job_id = header.get("job_id")
        if not isinstance(job_id, str) or not job_id or len(job_id) > MAX_ID_CHARS:
            raise ProtocolError("hello needs a job_id string")
        if header.get("version") != PROTOCOL_VERSION:
            wire.send_frame(conn, {"op": "error", "seq": None, "kind": "protocol",
                                   "message": f"protocol version {header.get('version')!r} is not {PROTOCOL_VERSION}"})
            return None
        with self._lock:
            if self._active is not None:
                job, since = self._active
                log.info("%s: job %s refused, system busy with job %s", peer, job_id, job)
                wire.send_frame(conn, {"op": "error", "seq": None, "kind": "busy",
                                       "message": f"system busy: in use by job {job} since {since}"})
                return None
            since = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
            self._active = (job_id, since)
        wire.send_frame(conn, {"op": "ok", "seq": None, "version": PROTOCOL_VERSION})
        return job_id

    def _serve_conn(self, conn: socket.socket, peer: str) -> None:
        with self._lock:
            self._conns.add(conn)
        holder = False
        try:
            conn.settimeout(self.hello_timeout)
            job_id = self._hello(conn, peer)
            if job_id is None:
                return
            holder = True
            conn.settimeout(None)
            wire.tune_socket(conn)
            log.info("job %s (%s) holds the system", job_id, peer)
            _Session(self, conn, peer, job_id).run()
        except (ProtocolError, EOFError, OSError, TimeoutError) as exc:
            log.warning("%s: closing the connection: %s", peer, exc or type(exc).__name__)
        except Exception:  # noqa: BLE001 - never take the server down
            log.exception("%s: closing the connection after an internal error", peer)
        finally:
            if holder:
                with self._lock:
                    self._active = None
                log.info("%s: system free", peer)
            with self._lock:
                self._conns.discard(conn)
            try:
                conn.close()
            except OSError:
                pass
            self._slots.release()
