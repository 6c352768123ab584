"""Save and load the program archive (``program.pt2``) without unsafe unpickling.

``torch.export.load`` can fall back to ``torch.load(weights_only=False)``, to ``pickle.loads``
(opaque constants) and to TorchScript object unpickling (custom-class constants). Loading
here is guarded twice:

1. the archive is inspected first: only the files ``torch.export.save`` writes for a plain
   program are allowed; custom/opaque objects and legacy pickled formats are refused, and
   every pickle inside (pickled weights/constants, sample inputs) must load with
   ``torch.load(weights_only=True)`` on its own;
2. while ``torch.export.load`` runs, ``torch.load`` is forced to ``weights_only=True`` and
   ``pickle.loads`` / the TorchScript object loader in torch's archive reader raise. These
   patches are process-wide for the duration of one load (loads are serialized by a lock);
   another thread calling ``torch.load`` at that moment also gets weights-only loading.

Anything refused raises :class:`~csrun.compiler.errors.UnsafeProgram`.
"""

from __future__ import annotations

import io
import json
import os
import threading
import zipfile
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

import torch

from csrun.compiler.errors import UnsafeProgram

PROGRAM_FILE = "program.pt2"
_LOCK = threading.Lock()
_DATA_SUFFIXES = ("data/weights/", "data/constants/", "data/sample_inputs/", "models/", "extra/")
_TOP_FILES = ("archive_format", "archive_version", ".data/version", "byteorder", ".data/serialization_id", "version")


def weight_placeholders(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Shape/dtype-only stand-ins for weights: each a zero-stride view of one element.

    Names that share a tensor (tied weights) share one stand-in, so the archive keeps the tie.
    Parameters stay Parameters (with their ``requires_grad``).
    """
    by_id: dict[int, torch.Tensor] = {}
    out: dict[str, torch.Tensor] = {}
    for name, t in state_dict.items():
        if id(t) not in by_id:
            z = torch.zeros((), dtype=t.dtype, device="cpu").expand(t.shape)
            by_id[id(t)] = torch.nn.Parameter(z, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else z
        out[name] = by_id[id(t)]
    return out


def save_program(program: torch.export.ExportedProgram, path: str, *, with_weights: bool = False) -> None:
    """Write the program archive with ``torch.export.save``.

    By default the archive holds the graph, signature and input schema but not the weight
    values: every parameter and buffer is a shape/dtype placeholder (see
    :func:`weight_placeholders`); a run takes its weights from the model or checkpoint
    (:func:`module_with_weights`). That keeps ``cs_<hash>/`` small and the cache honest (the
    compile key covers weight shapes, not values). ``with_weights=True`` stores the values.

    torch's serializer also runs ``canonicalize`` on a deep copy of the serialized program
    only as a self-test ("Test canonical form is well defined" in
    torch/_export/serde/serialize.py) and discards the result; that test is skipped here (it
    is about half of the graph's save time). The archive written is the same.
    """
    import warnings

    from torch._export.serde import serialize as serde

    with _LOCK:
        real = getattr(serde, "canonicalize", None)
        saved_state = program._state_dict
        if real is not None:
            serde.canonicalize = lambda ep, constants=None: ep  # type: ignore[assignment]
        if not with_weights:
            program._state_dict = weight_placeholders(saved_state)
        try:
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="No complete tensor found in the group")
                torch.export.save(program, path)
        finally:
            program._state_dict = saved_state
            if real is not None:
                serde.canonicalize = real  # type: ignore[assignment]


def has_weight_values(program: torch.export.ExportedProgram) -> bool:
    """False when the program's weights are shape-only placeholders (as saved by default).

    A placeholder is a tensor of more than one element whose strides are all zero.
    """
    for t in program.state_dict.values():
        if t.numel() > 1 and all(st == 0 for st in t.stride()):
            return False
    return True


def bind_weights(program: torch.export.ExportedProgram, weights: Mapping[str, torch.Tensor]) -> torch.export.ExportedProgram:
    """Give the program's parameters and buffers these values (e.g. ``model.state_dict()``), in place.

    Returns the same program. Names the program ties (one tensor under several names, e.g. an
    MLM head tied to the embeddings) get one tensor; parameters stay Parameters with their
    ``requires_grad``. The values are copied (the program never shares memory with the caller's
    model). Raises ``KeyError`` for a missing name and ``ValueError`` for a shape or dtype
    that differs from the program's.
    """
    retie_shared_weights(program)
    state = program.state_dict
    new: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for name, t in list(state.items()):
            if id(t) not in new:
                v = weights[name].detach()
                if tuple(v.shape) != tuple(t.shape) or v.dtype != t.dtype:
                    raise ValueError(f"weight {name}: the program has {t.dtype}{list(t.shape)}, "
                                     f"the given value is {v.dtype}{list(v.shape)}")
                v = v.clone()
                new[id(t)] = torch.nn.Parameter(v, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else v
            state[name] = new[id(t)]
    return program


def module_with_weights(program: torch.export.ExportedProgram, weights: Mapping[str, torch.Tensor]) -> torch.nn.Module:
    """``program.module()`` after :func:`bind_weights` (tied names stay one Parameter)."""
    return bind_weights(program, weights).module()


def _refuse(path: str, why: str) -> UnsafeProgram:
    return UnsafeProgram(f"refusing to load program {path}: {why}")


def _check_weights_only(blob: bytes, where: str, path: str) -> None:
    try:
        torch.load(io.BytesIO(blob), weights_only=True)
    except Exception as exc:
        raise _refuse(path, f"{where} needs more than weights-only unpickling ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else ''})") from None


def inspect_archive(path: str) -> None:
    """Refuse an archive that holds anything outside weights-only data (see module docstring)."""
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise _refuse(path, f"not a program archive ({exc})") from None
    with zf:
        names = zf.namelist()
        for name in names:
            rel = name.split("/", 1)[1] if "/" in name else name
            if rel in _TOP_FILES:
                continue
            if not rel.startswith(_DATA_SUFFIXES):
                raise _refuse(path, f"unexpected entry {name!r}")
            base = os.path.basename(rel)
            if rel.startswith("data/constants/") and (base.startswith("custom_obj") or base.startswith("opaque_obj")):
                raise _refuse(path, f"{name!r} is a custom/opaque object constant (needs full unpickling)")
            if rel in ("data/weights/model.pt", "data/constants/model.pt") or rel.startswith("models/") and rel.endswith(".pt"):
                raise _refuse(path, f"{name!r} is a legacy pickled payload")
        for name in names:
            rel = name.split("/", 1)[1] if "/" in name else name
            if rel.endswith("_config.json") and rel.startswith(("data/weights/", "data/constants/")):
                config = json.loads(zf.read(name)).get("config", {})
                prefix = name.rsplit("/", 1)[0] + "/"
                for fqn, meta in config.items():
                    if meta.get("use_pickle"):
                        _check_weights_only(zf.read(prefix + meta["path_name"]), f"pickled tensor {fqn!r}", path)
            elif rel.startswith("data/sample_inputs/"):
                _check_weights_only(zf.read(name), f"sample inputs {name!r}", path)


@contextmanager
def _weights_only_everywhere() -> Iterator[None]:
    from torch.export.pt2_archive import _package

    real_load = torch.load

    def forced_load(*args: Any, **kwargs: Any) -> Any:
        kwargs["weights_only"] = True
        return real_load(*args, **kwargs)

    class _NoPickle:
        @staticmethod
        def loads(*_a: Any, **_k: Any) -> Any:
            raise UnsafeProgram("the program archive asked for pickle.loads; refused")

        def __getattr__(self, name: str) -> Any:
            import pickle
            return getattr(pickle, name)

    def no_script_obj(*_a: Any, **_k: Any) -> Any:
        raise UnsafeProgram("the program archive asked for a TorchScript object; refused")

    with _LOCK:
        saved_pickle = _package.pickle
        saved_obj = torch._C._pickle_load_obj
        torch.load = forced_load  # type: ignore[assignment]
        _package.pickle = _NoPickle()  # type: ignore[assignment]
        torch._C._pickle_load_obj = no_script_obj  # type: ignore[attr-defined]
        try:
            yield
        finally:
            torch.load = real_load  # type: ignore[assignment]
            _package.pickle = saved_pickle
            torch._C._pickle_load_obj = saved_obj  # type: ignore[attr-defined]


def retie_shared_weights(program: torch.export.ExportedProgram) -> int:
    """Make weights that share storage one Parameter again; returns how many were retied.

    ``torch.export.load`` keeps tied weights (e.g. an MLM head tied to the embeddings) as
    views of one storage but wraps each name in its own Parameter, so ``program.module()``
    would train them apart. Names whose tensors share storage, offset, shape, stride and
    dtype get the first name's object back, as in the captured program.
    """
    first: dict[tuple, torch.Tensor] = {}
    retied = 0
    for name, t in list(program.state_dict.items()):
        if t.device.type == "meta":
            continue
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if key in first:
            if program.state_dict[name] is not first[key]:
                program.state_dict[name] = first[key]
                retied += 1
        else:
            first[key] = t
    return retied


def load_exported_program(path: str) -> torch.export.ExportedProgram:
    """Load a program archive with weights-only unpickling only; refuse anything else.

    Tied weights are retied (:func:`retie_shared_weights`).
    """
    inspect_archive(path)
    with _weights_only_everywhere():
        try:
            program = torch.export.load(path)
        except UnsafeProgram:
            raise
        except Exception as exc:
            raise _refuse(path, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from None
    retie_shared_weights(program)
    return program
