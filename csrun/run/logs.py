"""csrun's log records in a run: one console handler on the ``csrun`` logger, the root logger left to the user.

:func:`setup_logging` (called by :func:`csrun.run.run`) gives the ``csrun`` logger one handler
that writes ``LEVEL [role rank @ node]: message`` on stdout (``INFO [chief 0 @ cs-chief]: ...``;
off a terminal after the time of day, ``2026-11-27 00:52:10 INFO [chief 0 @ cs-chief]: ...``),
sets ``csrun.run``'s level, and leaves every record to **propagate**: the root logger is never
touched, so a user's own handlers (``logging.basicConfig(filename=...)``, a file handler, an
experiment tracker's) receive csrun's records too. Each record carries ``csrun_task``
(``chief 0 @ cs-chief``) for a user's format string (``%(csrun_task)s``).

One line per record on the console: when the root logger already has a handler that writes to
the console (a ``StreamHandler`` on stdout or stderr, e.g. from ``logging.basicConfig()``), that
handler prints csrun's records in the user's format and csrun's own handler stays quiet; a
handler writing elsewhere (a file, pytest's capture) does not count. The choice is made per
record, so handlers added after the run started are seen.

Calling it again (a second ``run()`` in one process) replaces the handler, never adds one.
"""

from __future__ import annotations

import logging
import sys

from csrun.cluster import cluster_info
from csrun.consoles import on_terminal

ROOT_LOGGER = "csrun"
"""The logger csrun's console handler sits on (all of ``csrun.*`` reaches it)."""


def task_label() -> str:
    """``<role> <rank> @ <node>`` of this task (``chief 0 @ cs-chief``)."""
    info = cluster_info()
    role = "chief" if info.is_chief else "streamer"
    return f"{role} {info.rank} @ {info.node_name}"


def _writes_to_console(handler: logging.Handler) -> bool:
    if isinstance(handler, logging.FileHandler) or not isinstance(handler, logging.StreamHandler):
        return False
    return handler.stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)


class _TaskConsole(logging.Filter):
    """Tags every record with ``csrun_task``; lets it through unless the user's root logger
    already prints to the console."""

    def __init__(self, label: str) -> None:
        super().__init__()
        self.label = label

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "csrun_task"):
            record.csrun_task = self.label
        return not any(_writes_to_console(h) for h in logging.getLogger().handlers)


class _CsrunHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """csrun's console handler (a class of its own, so a second setup finds and replaces it)."""


def setup_logging(level: str) -> logging.Handler:
    """Install csrun's console handler on the ``csrun`` logger and set ``csrun.run`` to ``level``
    (module manual); returns the handler."""
    label = task_label()
    handler = _CsrunHandler(sys.stdout)
    stamp = "" if on_terminal(sys.stdout) else "%(asctime)s "  # a log's lines say when (csrun.consoles)
    handler.setFormatter(logging.Formatter(f"{stamp}%(levelname)s [{label}]: %(message)s", "%Y-%m-%d %H:%M:%S"))
    handler.addFilter(_TaskConsole(label))
    base = logging.getLogger(ROOT_LOGGER)
    base.handlers[:] = [h for h in base.handlers if not isinstance(h, _CsrunHandler)] + [handler]
    run_log = logging.getLogger("csrun.run")
    run_log.handlers[:] = [h for h in run_log.handlers if not isinstance(h, _CsrunHandler)]
    run_log.setLevel(level.upper())
    run_log.propagate = True
    return handler


def flush_console() -> None:
    """Flush csrun's console handler (before a line printed straight to stdout)."""
    for h in logging.getLogger(ROOT_LOGGER).handlers:
        h.flush()
