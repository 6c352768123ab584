"""The compile directory ``cs_<hash>/`` and the cache over it.

A compile directory holds ``program.pt2``, ``spec.json``, ``plan.json``, ``estimate.json``,
``report.txt`` and, written last, ``COMPLETE``: a JSON marker with the SHA-256 and size of
every other file, the compile key and the source key.

*Compile key* (the ``<hash>``): SHA-256 over a stable text of the exported graph
(``str(graph)`` with memory addresses removed), the parameter/buffer names, shapes and
dtypes, the spec JSON (input schema, optimizer and its hyperparameters, schedule,
precision, scaling, clipping), the wafer spec, csrun's and torch's versions.

*Source key*: a cheaper fingerprint taken without capturing: the model's module tree
(classes, non-tensor attributes, parameter shapes/dtypes), the source files of its classes
and of the user modules they import, the batch schema and the same settings. A compile
whose source key matches a complete directory reuses it without running torch.export (the
fast cache hit); ``reuse_by_source=False`` turns this off and always captures. A compile
that captured and then found an existing directory by compile key adds its source key to
that marker (``more_source_keys``), so the next identical compile is fast again. What the
source key cannot see (e.g. a global in a module two imports away) can make a fast hit
stale; ``reuse_by_source=False`` is the strict mode.

Writes are atomic: everything goes into a temporary directory beside the target, the
marker last, then one ``rename``. A directory without a valid marker is never reused; it
is moved aside and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import types
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

import csrun
from csrun.compiler.wafer import WaferSpec
from csrun.files import atomic_write

MARKER = "COMPLETE"
PREFIX = "cs_"
ARTIFACTS = frozenset({"program.pt2", "spec.json", "plan.json", "estimate.json", "report.txt", MARKER, MARKER + ".part"})
"""The only names a compile directory holds; an incomplete directory with anything else in
it is not ours, and is never removed."""
_ADDR = re.compile(r"0x[0-9a-fA-F]+")


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def graph_text(program: torch.export.ExportedProgram) -> str:
    """A stable text of the exported graph (no memory addresses)."""
    return _ADDR.sub("0x?", str(program.graph))


def compile_key(program: torch.export.ExportedProgram, spec_json: str, wafer: WaferSpec) -> str:
    """The ``<hash>`` of ``cs_<hash>/`` (see the module docstring), 16 hex digits."""
    h = hashlib.sha256()
    h.update(graph_text(program).encode())
    for name, t in sorted(program.state_dict.items()):
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}\n".encode())
    h.update(spec_json.encode())
    h.update(json.dumps(wafer.to_dict(), sort_keys=True).encode())
    h.update(f"csrun={csrun.__version__} torch={torch.__version__}".encode())
    return h.hexdigest()[:16]


def _user_source_files(model: torch.nn.Module) -> list[str]:
    from csrun.compiler.locate import is_user_file

    files: set[str] = set()
    mods: set[types.ModuleType] = set()
    for m in model.modules():
        mod = sys.modules.get(type(m).__module__)
        if mod is not None:
            mods.add(mod)
    for mod in list(mods):
        for value in vars(mod).values():  # user modules imported by the model's modules, one level
            target = value if isinstance(value, types.ModuleType) else sys.modules.get(getattr(value, "__module__", "") or "")
            if isinstance(target, types.ModuleType):
                mods.add(target)
    for mod in mods:
        fn = getattr(mod, "__file__", None)
        if fn and fn.endswith(".py") and is_user_file(fn):
            files.add(os.path.abspath(fn))
    return sorted(files)


def _plain(value: Any) -> Any:
    if isinstance(value, (bool, int, float, str, type(None))):
        return value
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, torch.dtype):
        return str(value)
    return f"<{type(value).__qualname__}>"


def source_key(model: torch.nn.Module, batch_schema: str, settings_json: str, wafer: WaferSpec) -> str:
    """The fast fingerprint (see the module docstring), 64 hex digits."""
    h = hashlib.sha256()
    for name, m in model.named_modules():
        attrs = {k: _plain(v) for k, v in sorted(vars(m).items())
                 if not k.startswith("_") or k in ("_forward_hooks", "_forward_pre_hooks")}
        attrs["_hooks"] = [len(m._forward_hooks), len(m._forward_pre_hooks)]
        h.update(f"{name}|{type(m).__module__}.{type(m).__qualname__}|{json.dumps(attrs, sort_keys=True)}\n".encode())
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}:{t.requires_grad}\n".encode())
    for fn in _user_source_files(model):
        with open(fn, "rb") as f:
            h.update(fn.encode() + b"\0" + hashlib.sha256(f.read()).digest())
    h.update(batch_schema.encode())
    h.update(settings_json.encode())
    h.update(json.dumps(wafer.to_dict(), sort_keys=True).encode())
    h.update(f"csrun={csrun.__version__} torch={torch.__version__}".encode())
    return h.hexdigest()


def read_marker(directory: str) -> dict[str, Any] | None:
    """The marker of a complete, intact directory, else None.

    Checks that the marker parses and that every listed file exists with its recorded size
    (cheap, for cache look-ups); :func:`verify_checksums` reads every byte, when loading.
    """
    try:
        with open(os.path.join(directory, MARKER)) as f:
            marker = json.load(f)
        files = marker["files"]
        for name, meta in files.items():
            if os.path.getsize(os.path.join(directory, name)) != meta["size"]:
                return None
        return marker
    except (OSError, ValueError, KeyError, TypeError):
        return None


def verify_checksums(directory: str, marker: Mapping[str, Any]) -> list[str]:
    """Files whose SHA-256 differs from the marker's (empty when all match)."""
    bad = []
    for name, meta in marker["files"].items():
        path = os.path.join(directory, name)
        if not os.path.exists(path) or _sha256_file(path) != meta["sha256"]:
            bad.append(name)
    return bad


def find_by_source_key(parent: str, key: str) -> str | None:
    """A complete ``cs_*`` directory under ``parent`` whose marker has this source key."""
    try:
        entries = sorted(os.listdir(parent))
    except OSError:
        return None
    for entry in entries:
        if not entry.startswith(PREFIX):
            continue
        d = os.path.join(parent, entry)
        marker = read_marker(d)
        if marker is not None and key in marker_source_keys(marker):
            return d
    return None


def marker_source_keys(marker: Mapping[str, Any]) -> list[str]:
    """Every source key that led to this directory (the first compile's and later ones)."""
    keys = [marker.get("source_key", "")] + list(marker.get("more_source_keys", []))
    return [k for k in keys if k]


def add_source_key(directory: str, key: str) -> None:
    """Record another source key for a complete directory (atomic marker rewrite).

    A compile that had to capture (its source key was new) but found the same compile key
    adds its source key, so the next identical compile is a fast hit.
    """
    marker = read_marker(directory)
    if marker is None or key in marker_source_keys(marker):
        return
    marker["more_source_keys"] = (list(marker.get("more_source_keys", [])) + [key])[-16:]
    atomic_write(os.path.join(directory, MARKER), json.dumps(marker, indent=1, sort_keys=True))


@dataclass(kw_only=True)
class BuildResult:
    """Where the compile directory is and whether an existing one was reused."""

    directory: str
    reused: bool


def build_atomically(target: str, write: Callable[[str], None], *, compile_key: str, source_key: str) -> BuildResult:
    """Create ``target`` by calling ``write(tmpdir)`` and renaming; reuse it when complete.

    ``write`` puts the files into the temporary directory; the marker (with checksums) is
    written after it returns. A ``target`` without a valid marker is moved aside and removed.
    """
    if read_marker(target) is not None:
        return BuildResult(directory=target, reused=True)
    if os.path.isdir(target):
        foreign = sorted(set(os.listdir(target)) - ARTIFACTS)
        if foreign:
            from csrun.compiler.errors import ConfigError

            raise ConfigError(f"compile directory {target} exists and holds files that are not compile artifacts "
                              f"({', '.join(foreign[:5])})", fix="pass an empty or new directory as compile_dir")
    elif os.path.lexists(target):
        from csrun.compiler.errors import ConfigError

        raise ConfigError(f"compile directory {target} exists and is not a directory", fix="pass a new directory as compile_dir")
    parent = os.path.dirname(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.tmp-", dir=parent)
    try:
        write(tmp)
        files = {}
        for name in sorted(os.listdir(tmp)):
            p = os.path.join(tmp, name)
            files[name] = {"sha256": _sha256_file(p), "size": os.path.getsize(p)}
        marker = {"files": files, "compile_key": compile_key, "source_key": source_key,
                  "csrun_version": csrun.__version__, "torch_version": torch.__version__}
        with open(os.path.join(tmp, MARKER + ".part"), "w") as f:
            json.dump(marker, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(os.path.join(tmp, MARKER + ".part"), os.path.join(tmp, MARKER))
        if os.path.lexists(target):
            if read_marker(target) is not None:  # another process finished first
                shutil.rmtree(tmp, ignore_errors=True)
                return BuildResult(directory=target, reused=True)
            stale = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.stale-", dir=parent)
            os.replace(target, os.path.join(stale, "old"))
            shutil.rmtree(stale, ignore_errors=True)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return BuildResult(directory=target, reused=False)
