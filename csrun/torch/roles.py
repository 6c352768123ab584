"""A 2.x job's streamers wait for the chief to say what they are before they do anything else.

On the system the user's process drove the appliance; its input workers ran only the input
function. A csrun job starts the same script on every task, so a 2.x script (one that imports
:mod:`csrun.pytorch`, or ``cerebras.pytorch`` under ``--legacy-imports``) turns that around as
early as it can: when the API is imported, :func:`enable` marks the job as one whose streamers
wait, and on a streamer :func:`wait_for_role` blocks there, before any of the script's own
side effects (its folders, logs, checkpoints), until the chief assigns a role:

* ``{"role": "input", ...}``: the streamer builds the chief's input function and streams it
  (:mod:`csrun.pytorch.input_worker`); the script's flow never runs on it;
* ``{"role": "script"}``: the input function cannot be named by a streamer (it is defined in
  the script, or in a closure, or its arguments are not plain data), or the chief reached a
  ``Session`` or a collective without an executor: the streamer runs the script as before;
* the chief's STOP (it ended without a loop): the streamer exits 0.

The chief assigns once (:func:`assign`); :func:`ensure_assigned` assigns ``script`` to
streamers still waiting when the chief first needs them otherwise (a ``Session``, a
``rendezvous``). The wire is :mod:`csrun.stream.assignment`.
"""

from __future__ import annotations

from typing import Any

from csrun.stream.assignment import encode, send_assignment, wait_assignment
from csrun.torch.process_state import comm, state

_enabled = False
_assigned = False


def enable() -> None:
    """This job's streamers wait for a role (called when the 2.x API is imported; idempotent)."""
    global _enabled
    _enabled = state().streaming


def waiting() -> bool:
    """True on the chief while the streamers wait for their role."""
    return _enabled and not _assigned and state().info.is_chief


def assign(payload: bytes) -> None:
    """On the chief: send every streamer the encoded assignment (once; later calls do nothing)."""
    global _assigned
    if not waiting():
        return
    _assigned = True
    send_assignment(comm(), state().info.streamer_ranks, payload)


def ensure_assigned() -> None:
    """On the chief: streamers still waiting run the script as before (``{"role": "script"}``)."""
    assign(encode({"role": "script"}))


def wait_for_role() -> dict[str, Any] | None:
    """On a streamer of an enabled job: the chief's assignment (None: the chief's STOP came first)."""
    return wait_assignment(comm())


def reset_for_tests() -> None:
    """Forget the role state (unit tests only)."""
    global _enabled, _assigned
    _enabled = _assigned = False


__all__ = ["enable", "waiting", "assign", "ensure_assigned", "wait_for_role"]
