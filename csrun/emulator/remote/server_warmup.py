"""Ready a server for its first program while nobody waits: the job's first load then goes at once.

A ``cs_emulator`` starts with its job (``csrun_wse --emulator``) and then sits idle for
seconds while the job's chief imports torch, builds the model and compiles. Its first
``load`` used to pay for two things in that window's stead:

- torch's program deserialiser (``torch._export.serde``: it imports most of torch.export),
  seconds of a fresh process, and most of the first load's
  ``programming_time`` measured through the server on an H100 node (BENCHMARKS.md, on a GPU);
- on a GPU, the device's runtime: context, allocator, cuBLAS handle and a first kernel (a
  fraction of a second on that H100, more on a cold node).

:func:`warm_up` does both on a daemon thread as soon as the server listens. A load that arrives
meanwhile waits for the reader's import to finish (:func:`csrun.program.archive.import_reader`
lets one thread import it at a time: two importing torch.export's circular modules at once can
each get the other's half-initialised module) and for torch's thread-safe lazy CUDA start;
nothing runs twice. A failure is logged and left to the first load to report.
"""

from __future__ import annotations

import logging
import threading
import time

import torch

log = logging.getLogger(__name__)


def warm_up(device: str) -> threading.Thread:
    """Import the program reader and start ``device``'s runtime on a daemon thread; the thread."""
    thread = threading.Thread(target=_warm, args=(torch.device(device),), name="cs-emulator-warmup", daemon=True)
    thread.start()
    return thread


def _warm(dev: torch.device) -> None:
    t0 = time.perf_counter()
    try:
        from csrun.program.archive import import_reader

        import_reader()
        if dev.type == "cuda":
            a = torch.ones(64, 64, device=dev)
            (a @ a).sum().item()
    except Exception as exc:  # noqa: BLE001 - the first load reports a broken device itself
        log.warning("warming up for %s failed (%s: %s); the first program load will try again", dev,
                    type(exc).__name__, exc)
        return
    log.info("ready for a program on %s in %.1f s", dev, time.perf_counter() - t0)
