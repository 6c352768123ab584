"""The one reader (and writer) of program archives, ``program.pt2``: an archive is data.

Who uses it: the compile cache (``model_dir/cs_<hash>/program.pt2``, through
:mod:`csrun.compiler.cache.program_io`) and the ``cs_emulator`` server (the archive a client
sends with ``load``, through :mod:`csrun.emulator.remote.program`). Both read with
:func:`read_archive`; both write with :func:`write_archive`.

**What the server accepts (the decision).** The server takes the same archive the compile
cache keeps, not a second "plain graph" format: one writer, one reader, one set of rules, and
the link protocol stays as it is. What makes that safe is how the archive is read, not its
container. Read here, an archive *is* a plain serialized graph: the JSON graph
(``models/model.json``), JSON tables describing each weight and constant, and the raw
little-endian bytes of those tensors. Nothing else in it is looked at.

**Nothing in an archive is unpickled.**

- Weights and tensor constants are read as raw bytes onto the CPU and viewed with the
  sizes, strides and offset their JSON entry gives (checked against the bytes present). An
  entry stored pickled (``use_pickle``: a tensor subclass) is refused: torch would unpickle
  it; not even a ``weights_only`` unpickler runs here.
- Custom (TorchScript) and opaque (pickled Python object) constants are refused, whether
  listed in the constants table or merely present (``data/constants/custom_obj_*``,
  ``opaque_obj_*``); so are legacy pickled payloads and any entry torch's writer does not
  make (AOTInductor, ExecuTorch, other models, unknown files), duplicated or compressed
  entries, a different byte order or archive version.
- ``data/sample_inputs/model.pt`` (a pickle of example inputs) is never opened: the program
  is loaded without example inputs. :func:`write_archive` writes none either, so an archive
  csrun writes holds no pickle at all. ``extra/`` files are never opened.

**No string from an archive is executed or evaluated.** torch 2.13 would, on load or when
the module is built:

- ``guards_code`` (``models/model.json``): ``torch.export``'s unlift joins these strings into
  a function and ``exec``\\ s it in ``ExportedProgram.module()``. The field is dropped before
  deserialising (it only re-checks inputs; the engine checks every batch against the spec);
  with no example inputs torch generates no guard function at all.
- symbolic shape expressions (``as_expr`` anywhere: sizes, strides, SymInt/SymFloat/SymBool
  values and arguments) and ``range_constraints``: the deserialiser parses them with
  ``sympy.sympify``, which ``eval``\\ s. Device programs have static shapes: any of them is
  refused.
- names that end up in the Python source torch generates and ``exec``\\ s for the module's
  forward: parameter, buffer and constant names (``getattr(self, "<name>")``), the forward's
  argument names, subgraph names. They must be plain dotted names / identifiers.
- operator names (node targets, ``as_operator`` arguments), which torch resolves by
  ``getattr`` from the ``torch`` module and calls: only ``torch.ops.aten.*`` and
  ``torch.ops.prims.*`` operator overloads (not ``aten.from_file``), ``_operator.getitem``
  and the grad-mode / autocast wrappers are allowed.
- pytree specs naming a module to import (``collections.defaultdict`` factories, enum keys)
  are refused; node metadata that torch resolves by name (``source_fn_stack``, ``torch_fn``)
  is dropped (only ``stack_trace`` and ``nn_module_stack``, text, are kept).

A refusal is one :class:`ArchiveRefused` line naming the archive (its path, or "program sent
by client"), the entry or field, and why. Callers raise their own kinds from it
(``UnsafeProgram`` in the compile cache, ``ProgramRejected`` in the emulator).

**Tied weights.** Names whose JSON entries view the same bytes the same way (an embedding tied
to an output projection) become one tensor object again, as in the captured program; torch's
own loader makes a separate Parameter per name, and a program trained from that would train
the copies apart.

**Locks.** Nothing here patches ``torch.load`` or ``pickle``. One lock serialises torch's
(de)serialiser: its deserialiser keeps module-global state, and :func:`write_archive` skips
its canonical-form self-test by swapping one function, and its import of inductor's IR module
by a stand-in in ``sys.modules``, for the duration of a write.
"""

from __future__ import annotations

import contextlib
import io
import json
import keyword
import os
import re
import sys
import threading
import types
import zipfile
from typing import IO, Any, Iterator, Mapping

import torch

from csrun.errors import UserError

PROGRAM_FILE = "program.pt2"
"""The archive's name in a compile directory."""
FROM_CLIENT = "program sent by client"
"""How a refusal names an archive that came over the link."""

_LOCK = threading.Lock()
"""Serialises torch's program (de)serialiser (module-global state; see the module docstring) and
its first import (:func:`import_reader`)."""

_TOP_FILES = {"archive_format": "pt2", "archive_version": "0", "byteorder": "little",
              ".data/version": None, ".data/serialization_id": None}
_MODEL = "models/model.json"
_WEIGHTS_CONFIG = "data/weights/model_weights_config.json"
_CONSTANTS_CONFIG = "data/constants/model_constants_config.json"
_SAMPLE_INPUTS = "data/sample_inputs/model.pt"
_WEIGHT_FILE = re.compile(r"weight_\d+")
_CONSTANT_FILE = re.compile(r"tensor_\d+")
_FQN = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
_OP = re.compile(r"torch\.ops\.(aten|prims)\.([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)")
_HIGHER_ORDER = frozenset({"torch.ops.higher_order.wrap_with_set_grad_enabled",
                           "torch.ops.higher_order.wrap_with_autocast"})
_REFUSED_OPS = frozenset({"from_file"})
"""aten operators that reach outside the program (files)."""
_KEPT_NODE_METADATA = ("stack_trace", "nn_module_stack")
_PYTREE_IMPORTS = frozenset({"collections.defaultdict"})
_STRIDED = 7  # torch._export.serde.schema.Layout.Strided
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class ArchiveRefused(UserError):
    """A program archive that is not plain data (or is damaged); the message is one line."""


# writing -----------------------------------------------------------------------------------


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


def has_weight_values(program: torch.export.ExportedProgram) -> bool:
    """False when the program's weights are shape-only placeholders (:func:`weight_placeholders`).

    A placeholder is a tensor of more than one element whose strides are all zero.
    """
    for t in program.state_dict.values():
        if t.numel() > 1 and all(st == 0 for st in t.stride()):
            return False
    return True


def write_archive(program: torch.export.ExportedProgram, file: str | IO[bytes], *, with_weights: bool = True) -> None:
    """Write ``program`` (``torch.export.save``) to a path or binary file, without example inputs.

    ``with_weights=False`` stores every parameter and buffer as a shape/dtype placeholder
    (:func:`weight_placeholders`): the compile cache keeps no weight values, a run binds the
    model's or a checkpoint's. The program object is left as it was.

    torch's serializer also runs ``canonicalize`` on a deep copy of the serialized program
    only as a self-test ("Test canonical form is well defined" in
    torch/_export/serde/serialize.py) and discards the result; that test is skipped here (it
    is a large part of a graph's save time). And it imports inductor's IR module only to ask
    whether an argument is one of its buffers (:func:`_without_inductor_ir`). The archive
    written is the same.
    """
    import warnings

    from torch._export.serde import serialize as serde

    with _LOCK:
        real = getattr(serde, "canonicalize", None)
        saved_state, saved_inputs = program._state_dict, program._example_inputs
        if real is not None:
            serde.canonicalize = lambda ep, constants=None: ep  # type: ignore[assignment]
        if not with_weights:
            program._state_dict = weight_placeholders(saved_state)
        program._example_inputs = None
        try:
            with warnings.catch_warnings(), _without_inductor_ir():
                warnings.filterwarnings("ignore", message="No complete tensor found in the group")
                torch.export.save(program, file)
        finally:
            program._state_dict, program._example_inputs = saved_state, saved_inputs
            if real is not None:
                serde.canonicalize = real  # type: ignore[assignment]


_INDUCTOR_IR = "torch._inductor.ir"


def _class_named(name: str) -> type:
    """A new class called ``name`` (no object is an instance of it); dunder names stay missing."""
    if name.startswith("__"):
        raise AttributeError(name)
    return type(name, (), {})


@contextlib.contextmanager
def _without_inductor_ir() -> Iterator[None]:
    """While inside, ``import torch._inductor.ir`` gives a stand-in whose every attribute is a
    class of its own, unless the real module is already loaded.

    torch's serializer imports that module (most of a small program's first write: BENCHMARKS.md) for
    one check: is an argument an instance of inductor's ``Buffer`` or ``ReinterpretView``? No
    object can be an instance of a class of a module that was never loaded, so against the
    stand-in's classes the answer is the same "no", without the import. The modules
    ``torch.export.save`` imports first are imported before the stand-in goes in, so that no
    module is first imported beside it (and keeps one of its classes); the stand-in leaves
    ``sys.modules`` on the way out. Callers hold :data:`_LOCK`.
    """
    if _INDUCTOR_IR in sys.modules:
        yield
        return
    import torch.export.pt2_archive._package  # noqa: F401 - torch.export.save's own first import
    stand_in = types.ModuleType(_INDUCTOR_IR, "inductor's IR, not loaded (csrun.program.archive)")
    stand_in.__getattr__ = _class_named  # type: ignore[method-assign]  # a module's __getattr__ (PEP 562)
    sys.modules[_INDUCTOR_IR] = stand_in
    try:
        yield
    finally:
        if sys.modules.get(_INDUCTOR_IR) is stand_in:
            del sys.modules[_INDUCTOR_IR]


def archive_bytes(program: torch.export.ExportedProgram) -> bytes:
    """:func:`write_archive` (with weights) into bytes, as the link carries a program."""
    buf = io.BytesIO()
    write_archive(program, buf)
    return buf.getvalue()


# reading -----------------------------------------------------------------------------------


class _Reader:
    """One archive being read; ``refuse`` builds the one-line error naming it."""

    def __init__(self, zf: zipfile.ZipFile, source: str) -> None:
        self.zf = zf
        self.source = source
        self.entries: dict[str, zipfile.ZipInfo] = {}

    def refuse(self, where: str, why: str) -> ArchiveRefused:
        return ArchiveRefused(_one_line(f"{self.source}: {where[:200]}: {why}"))

    # the zip's entries -------------------------------------------------------------------

    def index(self) -> None:
        infos = self.zf.infolist()
        if not infos:
            raise self.refuse("archive", "empty")
        root = infos[0].filename.split("/", 1)[0]
        for info in infos:
            name = info.filename
            if "/" not in name or name.split("/", 1)[0] != root:
                raise self.refuse(name, f"outside the archive's one folder {root!r}")
            rel = name.split("/", 1)[1]
            if rel in self.entries:
                raise self.refuse(name, "appears twice in the archive")
            if info.compress_type != zipfile.ZIP_STORED:
                raise self.refuse(name, "compressed; torch.export.save stores entries uncompressed")
            self.entries[rel] = info
        for rel in self.entries:
            self._check_entry_name(rel)
        for rel, value in _TOP_FILES.items():
            if value is not None and self.text(rel).strip() != value:
                raise self.refuse(rel, f"must be {value!r} (got {self.text(rel).strip()[:20]!r})")
        if sys.byteorder != "little":  # pragma: no cover - no such hosts here
            raise self.refuse("byteorder", "this host is big-endian; archives hold little-endian tensors")
        for rel in (_MODEL, _WEIGHTS_CONFIG, _CONSTANTS_CONFIG):
            if rel not in self.entries:
                raise self.refuse(rel, "missing")

    def _check_entry_name(self, rel: str) -> None:
        base = rel.rsplit("/", 1)[-1]
        if rel in _TOP_FILES or rel in (_MODEL, _WEIGHTS_CONFIG, _CONSTANTS_CONFIG, _SAMPLE_INPUTS):
            return
        if rel.startswith("extra/"):
            return
        if rel.startswith("data/constants/") and base.startswith("opaque_obj"):
            raise self.refuse(rel, "an opaque constant (a pickled Python object); refused, nothing in a program "
                                   "archive is unpickled")
        if rel.startswith("data/constants/") and base.startswith("custom_obj"):
            raise self.refuse(rel, "a custom (TorchScript) object constant; refused, nothing in a program archive "
                                   "is unpickled")
        if rel.startswith("data/weights/") and _WEIGHT_FILE.fullmatch(base) and rel.count("/") == 2:
            return
        if rel.startswith("data/constants/") and _CONSTANT_FILE.fullmatch(base) and rel.count("/") == 2:
            return
        if rel.endswith(".pt"):
            raise self.refuse(rel, "a legacy pickled payload; refused, nothing in a program archive is unpickled")
        raise self.refuse(rel, "unexpected entry (not part of a torch.export program archive)")

    def raw(self, rel: str) -> bytes:
        try:
            return self.zf.read(self.entries[rel])
        except KeyError:
            raise self.refuse(rel, "missing") from None

    def text(self, rel: str) -> str:
        try:
            return self.raw(rel).decode("utf-8")
        except UnicodeDecodeError:
            raise self.refuse(rel, "not UTF-8 text") from None

    def json(self, rel: str) -> Any:
        try:
            return json.loads(self.text(rel))
        except (ValueError, RecursionError) as exc:
            raise self.refuse(rel, f"not valid JSON ({type(exc).__name__})") from None

    # tensors ------------------------------------------------------------------------------

    def tensors(self, config_rel: str, folder: str, pattern: re.Pattern[str]) -> dict[str, torch.Tensor]:
        """The tensors a payload table lists, read as raw bytes; tied entries are one object."""
        table = self.json(config_rel)
        config = table.get("config") if isinstance(table, dict) else None
        if not isinstance(config, dict):
            raise self.refuse(config_rel, "has no 'config' table")
        bases: dict[str, torch.Tensor] = {}
        views: dict[tuple, torch.Tensor] = {}
        out: dict[str, torch.Tensor] = {}
        used: set[str] = set()
        for fqn, meta in config.items():
            where = f"{config_rel} entry {fqn!r}"
            if not isinstance(fqn, str) or not _FQN.fullmatch(fqn):
                raise self.refuse(where, "not a plain dotted name")
            if not isinstance(meta, dict):
                raise self.refuse(where, "not a table")
            path = meta.get("path_name")
            if isinstance(path, str) and path.startswith(("custom_obj", "opaque_obj")):
                raise self.refuse(f"{folder}{path} (constant {fqn!r})", "a pickled object constant; refused, "
                                  "nothing in a program archive is unpickled")
            if meta.get("use_pickle"):
                raise self.refuse(f"{folder}{path} ({fqn!r})", "stored pickled (a tensor subclass); refused: tensors "
                                  "are read as raw bytes, never unpickled (not even weights-only)")
            if not isinstance(path, str) or not pattern.fullmatch(path):
                raise self.refuse(where, f"path_name {str(path)[:40]!r} is not a tensor file")
            dtype, size, stride, offset, requires_grad = self._tensor_meta(meta.get("tensor_meta"), where)
            is_param = bool(meta.get("is_param"))
            key = (path, dtype, size, stride, offset, is_param, requires_grad)
            if key not in views:
                if path not in bases:
                    bases[path] = self._storage(folder + path, dtype)
                base = bases[path]
                if base.dtype != dtype:
                    raise self.refuse(where, f"views {folder}{path} as {dtype}, another entry as {base.dtype}")
                numel = 1
                for n in size:
                    numel *= n
                if numel and offset + sum((n - 1) * s for n, s in zip(size, stride)) >= base.numel():
                    raise self.refuse(where, f"its view {list(size)} / strides {list(stride)} / offset {offset} "
                                             f"reaches past the {base.numel()} elements of {folder}{path}")
                t = base.as_strided(size, stride, offset)
                views[key] = torch.nn.Parameter(t, requires_grad=requires_grad) if is_param else t
            out[fqn] = views[key]
            used.add(path)
        unlisted = sorted(rel for rel in self.entries if rel.startswith(folder) and pattern.fullmatch(rel[len(folder):])
                          and rel[len(folder):] not in used)
        if unlisted:
            raise self.refuse(unlisted[0], f"not listed in {config_rel}")
        return out

    def _tensor_meta(self, meta: Any, where: str) -> tuple[torch.dtype, tuple[int, ...], tuple[int, ...], int, bool]:
        from torch._export.serde.schema import ScalarType
        from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE

        if not isinstance(meta, dict):
            raise self.refuse(where, "no tensor_meta")
        try:
            dtype = _SERIALIZE_TO_TORCH_DTYPE[ScalarType(meta["dtype"])]
        except (KeyError, ValueError, TypeError):
            raise self.refuse(where, f"unknown dtype {str(meta.get('dtype'))[:20]}") from None
        if meta.get("layout") != _STRIDED:
            raise self.refuse(where, "not a dense (strided) tensor")
        device = meta.get("device")
        if not isinstance(device, dict) or device.get("type") not in ("cpu", "cuda"):
            raise self.refuse(where, f"a tensor on {str(device)[:40]}; tensors are read onto the CPU from cpu or cuda")

        def ints(value: Any, what: str) -> tuple[int, ...]:
            if not isinstance(value, list):
                raise self.refuse(where, f"{what} is not a list")
            return tuple(self._int(v, f"{where} {what}") for v in value)

        size, stride = ints(meta.get("sizes"), "sizes"), ints(meta.get("strides"), "strides")
        if len(size) != len(stride):
            raise self.refuse(where, "sizes and strides differ in length")
        return dtype, size, stride, self._int(meta.get("storage_offset"), f"{where} storage_offset"), \
            bool(meta.get("requires_grad"))

    def _int(self, value: Any, where: str) -> int:
        if isinstance(value, dict) and "as_expr" in value:
            raise self.refuse(where, "a symbolic expression; device programs have static shapes")
        if not isinstance(value, dict) or set(value) != {"as_int"} or type(value["as_int"]) is not int \
                or value["as_int"] < 0:
            raise self.refuse(where, f"not a non-negative integer ({str(value)[:40]})")
        return value["as_int"]

    def _storage(self, rel: str, dtype: torch.dtype) -> torch.Tensor:
        if rel not in self.entries:
            raise self.refuse(rel, "missing")
        data = self.raw(rel)
        itemsize = torch.empty((), dtype=dtype).element_size()
        if len(data) % itemsize:
            raise self.refuse(rel, f"{len(data)} bytes is not a whole number of {dtype} elements")
        if not data:
            return torch.empty(0, dtype=dtype)
        return torch.frombuffer(bytearray(data), dtype=dtype)

    # the graph ----------------------------------------------------------------------------

    def graph_json(self) -> dict[str, Any]:
        """``models/model.json``, checked (see the module docstring) and with guards_code dropped."""
        doc = self.json(_MODEL)
        where = _MODEL
        if not isinstance(doc, dict) or not isinstance(doc.get("graph_module"), dict):
            raise self.refuse(where, "not a serialized ExportedProgram")
        doc["guards_code"] = []  # never executed: see the module docstring
        if doc.get("range_constraints"):
            raise self.refuse(f"{where} range_constraints", "symbolic shape ranges; device programs have static shapes")
        gm = doc["graph_module"]
        try:
            self._walk(gm, f"{where} graph_module")
        except RecursionError:
            raise self.refuse(where, "nested too deeply") from None
        signature = gm.get("signature") or {}
        for spec in signature.get("input_specs") or []:
            for kind, field in (("parameter", "parameter_name"), ("buffer", "buffer_name"),
                                ("tensor_constant", "tensor_constant_name")):
                name = (spec.get(kind) or {}).get(field) if isinstance(spec, dict) else None
                if name is not None and not (isinstance(name, str) and _FQN.fullmatch(name)):
                    raise self.refuse(f"{where} signature {field}", f"{str(name)[:60]!r} is not a plain dotted name")
            if isinstance(spec, dict) and "custom_obj" in spec:
                raise self.refuse(f"{where} signature", "a custom object input; refused")
        for entry in gm.get("module_call_graph") or []:
            sig = entry.get("signature") if isinstance(entry, dict) else None
            if not isinstance(sig, dict):
                continue
            for name in sig.get("forward_arg_names") or []:
                if not (isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)):
                    raise self.refuse(f"{where} forward_arg_names", f"{str(name)[:60]!r} is not a Python identifier")
            for field in ("in_spec", "out_spec"):
                self._check_treespec(sig.get(field), f"{where} module_call_graph {field}")
        return doc

    def _walk(self, value: Any, where: str) -> None:
        """Every union and node below ``value``: refuse what torch would evaluate or call."""
        if isinstance(value, list):
            for v in value:
                self._walk(v, where)
            return
        if not isinstance(value, dict):
            return
        if "as_expr" in value:
            raise self.refuse(where, "a symbolic expression (torch evaluates it with sympy); device programs have "
                                     "static shapes")
        if "as_custom_obj" in value or value.get("custom_obj_values"):
            raise self.refuse(where, "a custom object; refused")
        if "as_operator" in value:
            self._check_target(value["as_operator"], f"{where} as_operator")
        if "as_graph" in value:
            name = (value["as_graph"] or {}).get("name") if isinstance(value["as_graph"], dict) else None
            if not (isinstance(name, str) and name.isidentifier()):
                raise self.refuse(f"{where} as_graph", f"subgraph name {str(name)[:60]!r} is not an identifier")
        if "target" in value:  # a node (nothing else in the schema has a target)
            self._check_target(value["target"], f"{where} node {str(value.get('name'))[:40]}")
            if isinstance(value.get("metadata"), dict):
                value["metadata"] = {k: v for k, v in value["metadata"].items() if k in _KEPT_NODE_METADATA}
        for k, v in value.items():
            self._walk(v, f"{where}" if k in ("arg", "inputs", "outputs", "graph", "nodes") else f"{where} {k}")

    def _check_target(self, target: Any, where: str) -> None:
        if target == "_operator.getitem" or target in _HIGHER_ORDER:
            return
        m = _OP.fullmatch(target) if isinstance(target, str) else None
        if m is not None and m.group(2) not in _REFUSED_OPS:
            namespace, name, overload = m.groups()
            packet = getattr(getattr(torch.ops, namespace), name, None) if hasattr(torch.ops, namespace) else None
            op = getattr(packet, overload, None) if packet is not None else None
            if isinstance(op, torch._ops.OpOverload):
                return
        raise self.refuse(where, f"operator {str(target)[:80]!r} is not an aten/prims operator a program may call")

    def _check_treespec(self, text: Any, where: str) -> None:
        try:
            protocol, spec = json.loads(text)
        except (TypeError, ValueError, RecursionError):
            raise self.refuse(where, "not a serialized pytree spec") from None

        def walk(node: Any) -> None:
            if not isinstance(node, dict):
                raise self.refuse(where, "not a serialized pytree spec")
            if node.get("type") in _PYTREE_IMPORTS:
                raise self.refuse(where, f"a {node['type']} (torch imports a module named in the archive)")
            if isinstance(node.get("context"), str) and "__enum__" in node["context"]:
                raise self.refuse(where, "an enum key (torch imports a module named in the archive)")
            for child in node.get("children_spec") or []:
                walk(child)

        try:
            walk(spec)
        except RecursionError:
            raise self.refuse(where, "nested too deeply") from None


def _open(data: bytes | str) -> zipfile.ZipFile:
    return zipfile.ZipFile(io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else data)


def read_archive(data: bytes | str | os.PathLike[str], *, source: str | None = None) -> torch.export.ExportedProgram:
    """Load a program archive (bytes, or a path) as data; see the module docstring for the rules.

    ``source`` names the archive in refusals (default: the path, or :data:`FROM_CLIENT` for
    bytes). Raises :class:`ArchiveRefused` (one line) for anything refused or damaged. The
    program has no example inputs and no guards code; tied weights are one tensor.
    """
    import_reader()  # after a server's warm-up, or waiting for it: never beside it
    if isinstance(data, os.PathLike):
        data = os.fspath(data)
    name = source or (data if isinstance(data, str) else FROM_CLIENT)
    try:
        zf = _open(data)
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        reason = "not a zip file" if isinstance(exc, zipfile.BadZipFile) else str(exc)
        raise ArchiveRefused(_one_line(f"{name}: not a torch.export archive ({reason})")) from None
    with zf:
        reader = _Reader(zf, name)
        try:
            reader.index()
            doc = reader.graph_json()
            state_dict = reader.tensors(_WEIGHTS_CONFIG, "data/weights/", _WEIGHT_FILE)
            constants = reader.tensors(_CONSTANTS_CONFIG, "data/constants/", _CONSTANT_FILE)
        except ArchiveRefused:
            raise
        except Exception as exc:  # noqa: BLE001 - a damaged zip, or JSON of unexpected shapes
            raise ArchiveRefused(_one_line(f"{name}: damaged or malformed archive ({type(exc).__name__}: "
                                           f"{_first_line(exc)})")) from None
    return _deserialize(doc, state_dict, constants, name)


def import_reader() -> None:
    """Import torch's deserialiser (most of torch.export: seconds in a fresh process), so that a
    later :func:`read_archive` does not wait for it; a server calls this while it waits for work.

    One thread imports it at a time (a reader arriving meanwhile waits here): two threads
    importing torch.export's circular modules at once can each be handed the other's
    half-initialised module."""
    with _LOCK:
        from torch._export.serde import schema, serialize  # noqa: F401


def _deserialize(doc: dict[str, Any], state_dict: dict[str, torch.Tensor], constants: dict[str, torch.Tensor],
                 name: str) -> torch.export.ExportedProgram:
    """torch's deserialiser over the checked JSON, without example inputs (so without guards)."""
    from torch._export.serde import schema
    from torch._export.serde.serialize import ExportedProgramDeserializer, _dict_to_dataclass

    try:
        serialized = _dict_to_dataclass(schema.ExportedProgram, doc)
    except Exception as exc:  # noqa: BLE001 - any schema mismatch is a damaged archive
        raise ArchiveRefused(_one_line(f"{name}: {_MODEL}: not a serialized ExportedProgram "
                                       f"({type(exc).__name__}: {_first_line(exc)})")) from None
    with _LOCK:
        try:
            program = ExportedProgramDeserializer().deserialize(serialized, state_dict, constants, None)
        except Exception as exc:  # noqa: BLE001 - torch's own consistency checks
            raise ArchiveRefused(_one_line(f"{name}: {_MODEL}: torch could not rebuild the program "
                                           f"({type(exc).__name__}: {_first_line(exc)})")) from None
    program._guards_code = []
    return program


def _one_line(text: str) -> str:
    """``text`` with control characters (newlines included) escaped: names in an archive are
    the sender's, a refusal stays one line."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), text)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__

