"""Before MPI_Abort a task waits until the launcher has read its last words (csrun.stream.wire)."""

from __future__ import annotations

import io
import os
import sys
import threading
import time

import pytest

from csrun.stream.wire import wait_until_output_read


def test_waits_until_the_pipe_is_read_then_returns(monkeypatch: pytest.MonkeyPatch) -> None:
    read_end, write_end = os.pipe()
    stream = io.TextIOWrapper(io.FileIO(write_end, "w"), line_buffering=True)
    monkeypatch.setattr(sys, "stderr", stream)
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # not a pipe: skipped
    stream.write("csrun: error: the last words\n")
    stream.flush()
    got: list[bytes] = []

    def launcher() -> None:
        time.sleep(0.3)
        got.append(os.read(read_end, 4096))

    reader = threading.Thread(target=launcher)
    reader.start()
    wait_until_output_read(limit_s=20)
    assert got == [b"csrun: error: the last words\n"]  # it returned only once the words were taken
    reader.join()
    stream.close()
    os.close(read_end)


def test_a_launcher_that_never_reads_holds_the_task_only_for_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    read_end, write_end = os.pipe()
    stream = io.TextIOWrapper(io.FileIO(write_end, "w"))
    monkeypatch.setattr(sys, "stderr", stream)
    stream.write("unread\n")
    stream.flush()
    wait_until_output_read(limit_s=0.1)
    assert os.read(read_end, 4096) == b"unread\n"
    stream.close()
    os.close(read_end)
