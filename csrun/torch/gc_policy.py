"""The garbage collector in a training task: what was built before the work is not scanned again.

A training process holds a large heap of long-lived objects: torch's and csrun's modules, the
model, the optimizer, the dataset. CPython's full collections walk all of it: with torch
loaded one takes a noticeable time (BENCHMARKS.md), and several run while the model is built, while the first step
compiles (the capture imports ``torch.export`` and builds fake tensors) and then every so often
during the run. So csrun moves every object alive at two points into the collector's permanent
generation (:func:`gc.freeze`), where collections no longer look:

- at the end of :func:`csrun.torch.initialize` (the imports are done; the model comes next);
- at a Session's entry (the model, optimizer and loader are built);

and a Session's exit moves them all back (:func:`gc.unfreeze`), so that what became garbage
meanwhile is collected as before (a later Session freezes again at its entry).

Measured on the README's main job (chief): less time from ``import torch`` to the Session, and
less of the collector's time inside the Session (BENCHMARKS.md, ``bench/e2e/main_job.py``).

What it costs: an object that was already garbage (an unreachable cycle) at a freeze is freed
at the Session's end instead of earlier. ``CSRUN_GC_FREEZE=0`` (or ``off``, ``false``, ``no``)
leaves the collector alone; unset, ``1``, ``on``, ``true`` or ``yes``: the default, as above.
Any other value is a one-line error naming it (on the chief; a streamer then does not freeze).
"""

from __future__ import annotations

import gc

from csrun.env_settings import env_name, env_settings
from csrun.errors import UserError

ENV = env_name("gc_freeze")


def freeze_enabled() -> bool:
    """Whether sessions freeze the heap at entry (``CSRUN_GC_FREEZE``; default yes: :mod:`csrun.env_settings`)."""
    return env_settings().gc_freeze


def hold_setup_objects(*, strict: bool = True) -> bool:
    """Freeze every object alive now (at initialize, at a session's entry); True if it did.

    ``strict=False`` (a streamer): a bad ``CSRUN_GC_FREEZE`` only means no freeze here; the
    chief reports it."""
    try:
        enabled = freeze_enabled()
    except UserError:
        if strict:
            raise
        enabled = False
    if not enabled:
        return False
    gc.freeze()
    return True


def release_setup_objects(held: bool) -> None:
    """At a session's exit (``held``: its entry froze): give every frozen object back to the collector."""
    if held:
        gc.unfreeze()
