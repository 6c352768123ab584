"""A 2.x job's streamers are its input workers: they run the chief's input function, not the script.

On a streamer (:mod:`csrun.torch.roles`) :func:`on_import` runs when the 2.x API is first
imported, before the script's own side effects, and waits for the chief. On the chief, a
:class:`~csrun.pytorch.utils.data.DataExecutor` about to start its loop calls
:func:`assign_input`, which sends every streamer what the appliance sent its workers:

* the input function by name (``module`` and ``qualname``: a streamer imports it; the script's
  own folder is on its ``sys.path`` as on the chief's), and its arguments as plain data (the
  params: JSON values and tensors, never a pickle);
* the backend the chief made (its type and run path flags) and the half type and switch, so
  ``cstorch.use_cs()`` and ``cstorch.amp.get_half_dtype()`` answer the input function as on
  the chief;
* the chief's torch random state just before it built the same loader, so a shuffling loader
  draws what the chief's would;
* the loop's mode.

The streamer then builds the loader and streams it (the usual Session: same sharding rules,
same order, same input table) and exits 0 when the chief is done; nothing of the script's flow
(its folders, its logs, its checkpoints) ever runs there. An input function a streamer cannot
name (defined in the script itself, in a closure, a lambda) or arguments that are not plain
data make the chief assign ``script``: the streamers run the script up to the loop, as a
cbtorch script's do.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Iterator, NoReturn

import torch

from csrun.errors import UserError
from csrun.stream.assignment import AssignmentError, encode
from csrun.torch.process_state import state, stream_and_exit
from csrun.torch.roles import assign, enable, wait_for_role, waiting


class InputWorkerError(UserError):
    """The chief's input function could not be built on a streamer."""


_started = False


class _NoInput:
    """The source of a streamer released before any loop: the STOP waiting for it ends the stream."""

    def batches_per_epoch(self) -> int | None:
        return 0

    def stream(self, skip: int) -> Iterator[Any]:
        raise InputWorkerError("the chief started a stream this streamer has no input function for")


def on_import() -> None:
    """Mark the job's streamers as waiting; on a streamer, wait for the chief and act (see the manual)."""
    global _started
    if _started:
        return
    _started = True
    enable()
    st = state()
    if not st.streaming or st.info.is_chief:
        return
    document = wait_for_role()
    if document is None:
        stream_and_exit(_NoInput())
    role = document["role"]
    if role == "script":
        return
    if role == "input":
        serve(document)
    raise InputWorkerError(f"the chief assigned the unknown role {role!r}")


def _resolve(module: str, qualname: str) -> Any:
    """The object ``module.qualname`` names (importing ``module``)."""
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def _named(fn: Any) -> tuple[str, str] | None:
    """``(module, qualname)`` when a streamer can import ``fn`` by name, else None."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname:
        return None
    try:
        found = _resolve(module, qualname)
    except Exception:  # noqa: BLE001 - not nameable: the streamers run the script instead
        return None
    return (module, qualname) if found is fn else None


def assign_input(input_fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], mode: str,
                 rng_state: torch.Tensor | None = None) -> None:
    """On the chief, before its loop's first batch: tell the waiting streamers what to stream
    (``rng_state``: torch's state when the chief built the loader; None: now)."""
    if not waiting():
        return
    from csrun.pytorch.backends import current_backend, training_settings

    name = _named(input_fn)
    backend = current_backend()
    payload = encode({"role": "script"})
    if name is not None and backend is not None:
        settings = training_settings()
        options = backend.options
        candidate = {
            "role": "input", "module": name[0], "qualname": name[1], "args": list(args), "kwargs": dict(kwargs),
            "mode": mode, "sys_path": [p for p in sys.path if isinstance(p, str)],
            "rng_state": torch.get_rng_state() if rng_state is None else rng_state,
            "backend": {"backend_type": options.backend_type.value, "cs_ip": options.cs_ip,
                        "compile_only": options.compile_only, "validate_only": options.validate_only},
            "half_dtype": settings.half_dtype, "mixed_precision": settings.mixed_precision,
        }
        try:
            payload = encode(candidate)  # packed once: what is checked is what is sent
        except (TypeError, ValueError, AssignmentError):
            pass  # arguments that are not plain data (or too big): the streamers run the script
    assign(payload)


def serve(document: dict[str, Any]) -> NoReturn:
    """On a streamer: build the chief's input function's loader and stream it; never returns."""
    import csrun.torch as cbtorch
    from csrun.pytorch.backends import backend, update_settings

    for path in document.get("sys_path", []):
        if isinstance(path, str) and path not in sys.path and os.path.isdir(path):
            sys.path.append(path)
    update_settings(half_dtype=document["half_dtype"], mixed_precision=bool(document["mixed_precision"]))
    options = document["backend"]
    backend(options["backend_type"], cs_ip=options["cs_ip"], compile_only=bool(options["compile_only"]),
            validate_only=bool(options["validate_only"]))  # the half type and switch: the settings above
    module, qualname = str(document["module"]), str(document["qualname"])
    try:
        fn = _resolve(module, qualname)
    except (ImportError, AttributeError) as exc:
        raise InputWorkerError(f"the chief's input function {module}.{qualname} does not import on this "
                               f"streamer ({exc}): every task must see the same files") from None
    torch.set_rng_state(document["rng_state"])
    loader = fn(*document.get("args", []), **document.get("kwargs", {}))
    if not isinstance(loader, torch.utils.data.DataLoader):
        raise InputWorkerError(f"{module}.{qualname}() returned {type(loader).__name__}: the input function must "
                               f"return a torch.utils.data.DataLoader")
    cbtorch.Session(cbtorch.dataloader(loader), mode=str(document.get("mode", "train"))).__enter__()  # streams, exits 0
    raise InputWorkerError("the streamer's Session returned")  # not reached: a streamer's Session ends the process


__all__ = ["InputWorkerError", "on_import", "assign_input", "serve"]
