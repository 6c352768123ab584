"""A cs_emulator server for the tests that talk to one (tests/emulator/test_server.py,
tests/program/test_archive.py): the ``server`` fixture, its token and address, and a connect
that waits while the server is still busy with a departed client."""

from __future__ import annotations

import logging
import time
from typing import Iterator

import pytest

from csrun.emulator.remote import wire
from csrun.emulator.remote.client import RemoteDevice
from csrun.emulator.remote.errors import SystemBusy, SystemUnreachable
from csrun.emulator.remote.server import EmulatorServer
from csrun.program.archive import import_reader

TOKEN = "s3cret-token"


@pytest.fixture()
def server(caplog: pytest.LogCaptureFixture) -> Iterator[EmulatorServer]:
    caplog.set_level(logging.INFO, logger="csrun.emulator.remote.server")
    # The server's warm-up imports the program reader on a thread of this process, where a test
    # may be importing torch.export's circular modules itself (torch.export.export): imported
    # here first, the warm-up finds it done. (A cs_emulator process imports nothing beside it.)
    import_reader()
    srv = EmulatorServer(token=TOKEN, port=0, limits=wire.Limits(max_header_bytes=64 << 10,
                                                                  max_tensor_bytes=8 << 20))
    srv.start()
    yield srv
    srv.shutdown()
    # nothing may have escaped as an internal error
    assert not [r for r in caplog.records if "internal error" in r.getMessage()], "server hit an internal error"


def addr(srv: EmulatorServer) -> str:
    return f"127.0.0.1:{srv.address[1]}"


def connect_when_free(srv: EmulatorServer, job: str, timeout: float = 15.0) -> RemoteDevice:
    """Connect, retrying while the system is still busy with a departed client."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return RemoteDevice(addr(srv), TOKEN, job, connect_timeout=5)
        except (SystemBusy, SystemUnreachable):  # busy, or connection slots still full after a flood
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
