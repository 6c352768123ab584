"""The cs_emulator server under abuse: wrong tokens, garbage, oversized frames, hostile programs,
a second job, a client killed mid-step, SIGTERM. It must survive all of them and keep training."""

from __future__ import annotations

import io
import logging
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest
import torch

from csrun.emulator.remote import wire
from csrun.emulator.remote.client import RemoteDevice
from csrun.emulator.remote.errors import AuthenticationFailed, ProgramRejected, SystemBusy, SystemUnreachable
from csrun.program.errors import SpecError
from csrun.emulator.remote.program import load_program, save_program
from csrun.emulator.remote.server import EmulatorServer

from tests.emulator.conftest import TOKEN, addr, connect_when_free
from tests.tiny_models import MLP, mlp_batches
from .helpers import make_program, raw_hello

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def program() -> tuple:
    batches = mlp_batches(6)
    ep, spec = make_program(MLP(), batches[0])
    return ep, spec, batches


def train_ok(srv: EmulatorServer, program: tuple, job: str = "good-job") -> None:
    """A well-behaved client can load and train."""
    ep, spec, batches = program
    with connect_when_free(srv, job) as dev:
        dev.load(ep, spec)
        losses = [h.result()["loss"].item() for h in [dev.submit(b) for b in batches]]
    assert all(map(lambda x: x == x, losses)) and len(losses) == len(batches)


def test_wrong_token_is_refused(server: EmulatorServer, program: tuple) -> None:
    with pytest.raises(AuthenticationFailed, match="authentication failed"):
        RemoteDevice(addr(server), "not-the-token", "intruder", connect_timeout=5)
    train_ok(server, program)


def test_second_client_is_told_busy(server: EmulatorServer, program: tuple) -> None:
    """It waits in the queue (tests/emulator/test_server_queue.py) and, over its queue timeout, is told why."""
    with RemoteDevice(addr(server), TOKEN, "job-41", connect_timeout=5):
        with pytest.raises(SystemBusy, match=rf"^cs_emulator at {addr(server)} is still busy with job job-41: this job "
                                             r"waited 0.3 s in its queue and was at position 1; CSRUN_QUEUE_TIMEOUT"):
            RemoteDevice(addr(server), TOKEN, "job-42", connect_timeout=5, queue_timeout=0.3)
        deadline = time.monotonic() + 10
        while server.queued and time.monotonic() < deadline:  # its bye is on the way
            time.sleep(0.01)
        assert server.queued == []
    train_ok(server, program)


def _raw(srv: EmulatorServer) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", srv.address[1]), timeout=5)
    return s


def _closed_soon(s: socket.socket) -> bool:
    """True when the server closes the socket (after at most an error frame)."""
    s.settimeout(5)
    try:
        while s.recv(65536):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False


def _hello(s: socket.socket, token: str = TOKEN, job: str = "fuzz") -> None:
    head = raw_hello(s, token, job)
    assert head["op"] == "ok", head


def _garbage(rng: random.Random) -> bytes:
    good = b"".join([wire.MAGIC, struct.pack(">I", 40), b'{"op":"hello","token":"x","job_id":"j"}  '])
    kind = rng.randrange(6)
    if kind == 0:
        return rng.randbytes(rng.randrange(0, 300))
    if kind == 1:
        return good[: rng.randrange(len(good))]  # truncated
    if kind == 2:
        return wire.MAGIC + struct.pack(">I", rng.randrange(1 << 32)) + rng.randbytes(rng.randrange(64))
    if kind == 3:
        body = bytes(rng.choice(b'{}[]":,0123456789tensorsdtypeshapeop') for _ in range(rng.randrange(80)))
        return wire.MAGIC + struct.pack(">I", len(body)) + body
    if kind == 4:
        head = {"op": rng.choice(["hello", "step", "load", "bye", 7, None]), "token": rng.choice([TOKEN, "x", 3]),
                "job_id": rng.choice(["j", "", 5]), "version": rng.choice([1, 2]),
                "tensors": rng.choice([[], [{"dtype": "float32", "shape": [1 << 40]}], "x", [{"dtype": "evil"}]])}
        body = str(head).encode()
        return wire.MAGIC + struct.pack(">I", len(body)) + body
    return b"[" * rng.randrange(1, 5000)


def test_fuzzed_frames_never_take_the_server_down(server: EmulatorServer, program: tuple) -> None:
    rng = random.Random(1234)
    for i in range(2000):
        s = _raw(server)
        try:
            s.sendall(_garbage(rng))
            if i % 2:
                s.shutdown(socket.SHUT_WR)  # half of them hang up at once, half wait for the verdict
                _closed_soon(s)
        except OSError:
            pass
        finally:
            s.close()
    # garbage inside an authenticated session closes it and frees the system
    for i in range(150):
        s = _raw(server)
        _hello(s, job=f"fuzz-{i}")
        try:
            s.sendall(_garbage(rng) or b"x")
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server may already have closed it on the first bad bytes
        assert _closed_soon(s)
        s.close()
    train_ok(server, program)


def test_oversized_header_and_tensor_are_refused_without_reading(server: EmulatorServer, program: tuple) -> None:
    s = _raw(server)
    s.sendall(wire.MAGIC + struct.pack(">I", 1 << 31))  # claims a 2 GiB header, sends nothing more
    assert _closed_soon(s)
    s.close()
    s = _raw(server)
    _hello(s)
    head = {"op": "step", "seq": 1, "batch": None,
            "tensors": [{"dtype": "float32", "shape": [1 << 20, 1 << 10]}]}  # 4 GiB announced
    body = str(head).replace("'", '"').replace("None", "null").encode()
    s.sendall(wire.MAGIC + struct.pack(">I", len(body)) + body)
    assert _closed_soon(s)
    s.close()
    too_many = {"op": "step", "seq": 1, "tensors": [{"dtype": "uint8", "shape": [0]}] * 5000}
    s = _raw(server)
    _hello(s, job="many")
    body = str(too_many).replace("'", '"').encode()
    s.sendall(wire.MAGIC + struct.pack(">I", len(body)) + body)
    assert _closed_soon(s)
    s.close()
    train_ok(server, program)


def _hostile_archive(marker: Path) -> bytes:
    """A valid program archive whose sample-inputs pickle calls os.mkdir(marker) when fully unpickled."""

    class Evil:
        def __reduce__(self) -> tuple:
            return (os.mkdir, (str(marker),))

    ep = torch.export.export(MLP(), (mlp_batches(1)[0],))
    src = zipfile.ZipFile(io.BytesIO(save_program(ep)))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename.endswith("sample_inputs/model.pt"):
                buf = io.BytesIO()
                torch.save(((Evil(),), {}), buf)
                data = buf.getvalue()
            dst.writestr(info, data)
    return out.getvalue()


def test_hostile_sample_inputs_are_never_unpickled(tmp_path: Path, server: EmulatorServer, program: tuple) -> None:
    marker = tmp_path / "pwned"
    data = _hostile_archive(marker)
    # the archive is really hostile: torch's own loader falls back to full unpickling and runs it
    logging.getLogger("torch._export.serde.serialize").disabled = True
    torch.export.load(io.BytesIO(data))
    assert marker.exists()
    marker.rmdir()
    # the one archive reader never opens the sample inputs (csrun.program.archive)
    assert load_program(data).example_inputs is None
    assert not marker.exists()
    with pytest.raises(ProgramRejected, match="not a torch.export archive"):
        load_program(b"PK not really")
    # over the link: it loads and trains without running the pickle; a non-archive is refused
    # and the session goes on
    ep, spec, batches = program
    with RemoteDevice(addr(server), TOKEN, "hostile", connect_timeout=5) as dev:
        blob = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        dev._request("ok", {"op": "load", "spec": spec.to_json()}, [blob]).result()
        assert dev.submit(batches[0]).result()["loss"].dim() == 0
        assert not marker.exists()
        junk = torch.frombuffer(bytearray(b"PK not really"), dtype=torch.uint8)
        with pytest.raises(SpecError, match="program sent by client: not a torch.export archive"):
            dev._request("ok", {"op": "load", "spec": spec.to_json()}, [junk]).result()
        dev.load(ep, spec)
        assert dev.submit(batches[0]).result()["loss"].dim() == 0


def test_state_round_trips_over_the_link(server: EmulatorServer, program: tuple) -> None:
    ep, spec, batches = program
    with RemoteDevice(addr(server), TOKEN, "ckpt", connect_timeout=5) as dev:
        dev.load(ep, spec)
        for b in batches[:3]:
            dev.submit(b)
        saved = dev.state_dict()
        tail = [dev.submit(b).result()["loss"].item() for b in batches[3:]]
        dev.load_state_dict(saved)
        again = [dev.submit(b).result()["loss"].item() for b in batches[3:]]
        assert dev.global_step == len(batches)
    assert saved["global_step"] == 3 and tail == again


CLIENT = textwrap.dedent("""
    import sys, torch
    from csrun.emulator.remote.client import RemoteDevice
    from tests.emulator.helpers import make_program
    from tests.tiny_models import MLP, mlp_batches
    batches = mlp_batches(1, bs=2048)
    ep, spec = make_program(MLP(d_in=12, hidden=512), batches[0])
    dev = RemoteDevice(sys.argv[1], sys.argv[2], "doomed-job", queue_depth=8)
    dev.load(ep, spec)
    for _ in range(8):
        dev.submit(batches[0])
    print("submitted", flush=True)
    dev.synchronize()
""")


def test_client_killed_mid_step_frees_the_system(server: EmulatorServer, program: tuple) -> None:
    proc = subprocess.Popen([sys.executable, "-c", CLIENT, addr(server), TOKEN], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "submitted"
        assert server.busy_with is not None and server.busy_with[0] == "doomed-job"
        proc.kill()  # SIGKILL while its steps run
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    train_ok(server, program, job="after-the-crash")


def test_unreachable_system_message() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nobody listens here once closed
    t0 = time.monotonic()
    with pytest.raises(SystemUnreachable, match=rf"could not reach the system at 127.0.0.1:{port}: nothing answered within 0.5 s \(is cs_emulator running there\? check --cs_ip; CSRUN_CONNECT_TIMEOUT"):
        RemoteDevice(f"127.0.0.1:{port}", TOKEN, "lost", connect_timeout=0.5)
    assert time.monotonic() - t0 < 5


def test_cli_writes_a_token_serves_and_stops_on_sigterm(tmp_path: Path, program: tuple) -> None:
    token_file = tmp_path / "sub" / "token"
    env = dict(os.environ)
    env.pop("CSRUN_EMULATOR_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "csrun.cli.cs_emulator", "--listen", "127.0.0.1:0",
                             "--token-file", str(token_file), "--log-level", "warning", "--wait-per-job", "7"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert str(token_file) in first and "0600" in first
        assert (token_file.stat().st_mode & 0o777) == 0o600
        listening = proc.stdout.readline()
        assert "listening on 127.0.0.1:" in listening
        port = int(listening.split("127.0.0.1:")[1].split()[0])
        ep, spec, batches = program
        with RemoteDevice(f"127.0.0.1:{port}", token_file.read_text().strip(), "cli-job", connect_timeout=10) as dev:
            dev.load(ep, spec)
            assert dev.submit(batches[0]).result()["loss"].dim() == 0
            with socket.create_connection(("127.0.0.1", port), timeout=10) as queued:  # told the operator's allowance
                assert raw_hello(queued, token_file.read_text().strip(), "next-job")["wait_per_job"] == 7.0
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert "stopped" in out
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_huge_shape_fails_the_step_in_one_logged_line(server: EmulatorServer, program: tuple,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """An empty tensor with a 2^30 dimension passes the wire (0 bytes) and fails the step: the
    client is told, the server logs one line (the traceback only at debug level)."""
    from csrun.program.errors import StepFailed

    caplog.set_level(logging.INFO)
    ep, spec, batches = program
    with connect_when_free(server, "huge") as dev:
        dev.load(ep, spec)
        with pytest.raises(StepFailed, match="1073741824"):
            dev.submit((torch.empty(1 << 30, 0), batches[0][1])).result()
    failed = [r for r in caplog.records if "failed on the device" in r.getMessage()]
    assert failed and "1073741824" in failed[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.INFO and r.exc_info], "a traceback was logged"
    train_ok(server, program, job="after-the-huge-shape")


def test_the_warm_up_imports_the_program_reader_and_a_load_can_race_it(tmp_path: Path, program: tuple) -> None:
    archive = tmp_path / "program.bin"
    archive.write_bytes(save_program(program[0]))
    code = ("import sys, torch\n"
            "from csrun.emulator.remote.server_warmup import warm_up\n"
            "from csrun.emulator.remote.program import load_program\n"
            "assert 'torch._export.serde.serialize' not in sys.modules\n"
            "thread = warm_up('cpu')\n"
            f"load_program(open({str(archive)!r}, 'rb').read())  # while the warm-up imports\n"
            "thread.join(120)\n"
            "assert 'torch._export.serde.serialize' in sys.modules\n"
            "assert not torch.cuda.is_initialized()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
