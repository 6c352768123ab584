"""``cerebras.appliance.log``: the ``wsc`` logger and the appliance's two extra level names.

``wsc_logger`` is the logger of the cluster's messages (``logging.getLogger("wsc")``);
``get_level_name`` turns a level given as text (``"info"``, ``"VERBOSE"``, ``"TRACE"``, a
number) into the ``logging`` level; ``collect_wsc_log_settings`` returns the levels set on
``wsc`` and its children (the settings the appliance would have forwarded).
"""

from __future__ import annotations

import logging

from csrun.appliance.errors import ApplianceError

TRACE = logging.DEBUG - 5
"""The appliance's level below DEBUG."""
VERBOSE = logging.INFO - 5
"""The appliance's level between DEBUG and INFO."""

logging.addLevelName(TRACE, "TRACE")
logging.addLevelName(VERBOSE, "VERBOSE")

wsc_logger = logging.getLogger("wsc")
"""The logger of the cluster's (here: csrun's device) messages."""


def get_level_name(level: str | int) -> int:
    """The ``logging`` level of ``level`` (a name in any case, ``TRACE``, ``VERBOSE`` or a number)."""
    if isinstance(level, bool):
        raise ApplianceError(f"log level {level!r}: give a level name (info, debug, verbose, trace, ...) or a number")
    if isinstance(level, int):
        return level
    text = str(level).strip()
    if text.lstrip("-").isdigit():
        return int(text)
    number = logging.getLevelName(text.upper())
    if not isinstance(number, int):
        names = ", ".join(sorted(n.lower() for n in logging.getLevelNamesMapping()))
        raise ApplianceError(f"log level {level!r}: not a level; give one of {names}, or a number")
    return number


def collect_wsc_log_settings() -> dict[str, int]:
    """The levels set on ``wsc`` and on its child loggers (name -> level; ``""`` is ``wsc``)."""
    settings: dict[str, int] = {}
    if wsc_logger.level:
        settings[""] = wsc_logger.level
    for name, logger in logging.root.manager.loggerDict.items():
        if name.startswith("wsc.") and isinstance(logger, logging.Logger) and logger.level:
            settings[name[len("wsc."):]] = logger.level
    return settings


__all__ = ["TRACE", "VERBOSE", "wsc_logger", "get_level_name", "collect_wsc_log_settings"]
