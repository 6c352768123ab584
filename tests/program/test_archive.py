"""The one program-archive reader (csrun.program.archive) on both of its paths: the emulator
server (an archive a token holder sends) and the compile cache's reuse of ``cs_*/program.pt2``.

Each hostile archive is first shown to run its code under torch's own loader; then neither path
may run it (a marker directory must never appear): it is refused with one line naming the
archive and the field, or loaded with the field ignored. Tied weights stay tied on the server,
and a normal program trains bit for bit as it does from torch's reader.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import pickle
import zipfile
from pathlib import Path
from typing import Any, Callable

import pytest
import torch
from torch import nn

from csrun.compiler import CompileSettings, compile_only, load_program, module_with_weights
from csrun.compiler.errors import UnsafeProgram
from csrun.emulator.embedded import EmbeddedDevice
from csrun.program.errors import SpecError
from csrun.emulator.remote.program import save_program
from csrun.emulator.remote.server import EmulatorServer
from csrun.program.archive import FROM_CLIENT, ArchiveRefused, read_archive
from tests.emulator.conftest import connect_when_free
from tests.emulator.helpers import eager_losses, make_spec
from tests.tiny_models import MLP, DeepMLP, TinyTransformer, lm_batches, mlp_batches

SETTINGS = CompileSettings(mode="train", learning_rate=1e-3)


# building hostile archives ----------------------------------------------------------------------


class _MkdirOnUnpickle:
    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple:
        return (os.mkdir, (self.path,))


def _rewrite(data: bytes, edit: Callable[[str, bytes], bytes | None], extra: dict[str, bytes] | None = None) -> bytes:
    """A copy of the archive with each entry passed through ``edit(rel, data)`` (None drops it)
    and ``extra`` entries (names below the archive's folder) added."""
    src = zipfile.ZipFile(io.BytesIO(data))
    root = src.namelist()[0].split("/", 1)[0]
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            new = edit(info.filename.split("/", 1)[1], src.read(info.filename))
            if new is not None:
                dst.writestr(info, new)
        for rel, blob in (extra or {}).items():
            dst.writestr(f"{root}/{rel}", blob)
    return out.getvalue()


def _edit_json(rel_wanted: str, fn: Callable[[Any], None]) -> Callable[[str, bytes], bytes]:
    def edit(rel: str, data: bytes) -> bytes:
        if rel != rel_wanted:
            return data
        doc = json.loads(data)
        fn(doc)
        return json.dumps(doc).encode()
    return edit


def pickled_opaque_constant(data: bytes, marker: Path, batch: Any = None) -> bytes:
    """An opaque constant: torch's loader calls pickle.loads on it."""
    def add(doc: Any) -> None:
        doc["config"]["evil"] = {"path_name": "opaque_obj_0", "is_param": False, "use_pickle": True, "tensor_meta": None}
    return _rewrite(data, _edit_json("data/constants/model_constants_config.json", add),
                    {"data/constants/opaque_obj_0": pickle.dumps(_MkdirOnUnpickle(marker))})


def pickled_tensor_constant(data: bytes, marker: Path, batch: Any = None) -> bytes:
    """A tensor constant stored pickled: torch's loader calls torch.load(weights_only=False) on it."""
    buf = io.BytesIO()
    torch.save({"t": _MkdirOnUnpickle(marker)}, buf)

    def add(doc: Any) -> None:
        doc["config"]["evil"] = {"path_name": "tensor_9", "is_param": False, "use_pickle": True, "tensor_meta": None}
    return _rewrite(data, _edit_json("data/constants/model_constants_config.json", add),
                    {"data/constants/tensor_9": buf.getvalue()})


def guards_code(data: bytes, marker: Path, batch: Any = None) -> bytes:
    """guards_code: torch exec's it when the module is built (ExportedProgram.module()), given
    sample inputs, which the attacker supplies too."""
    def add(doc: Any) -> None:
        doc["guards_code"] = [f"__import__('os').mkdir({str(marker)!r}) is None"]
    buf = io.BytesIO()
    torch.save(((batch,), {}), buf)
    edit_model = _edit_json("models/model.json", add)
    return _rewrite(data, lambda rel, d: buf.getvalue() if rel == "data/sample_inputs/model.pt" else edit_model(rel, d))


def symbolic_size(data: bytes, marker: Path, batch: Any = None) -> bytes:
    """A size that is an expression: torch's deserialiser parses it with sympy.sympify (eval)."""
    def add(doc: Any) -> None:
        values = doc["graph_module"]["graph"]["tensor_values"]
        first = values[next(iter(values))]
        first["sizes"][0] = {"as_expr": {"expr_str": f"__import__('os').mkdir({str(marker)!r})", "hint": {"as_int": 1}}}
    return _rewrite(data, _edit_json("models/model.json", add))


def parameter_name(data: bytes, marker: Path, batch: Any = None) -> bytes:
    """A weight name with a quote: torch writes it into the forward's source (getattr(self, "<name>"))."""
    path = "str(bytes([" + ",".join(str(b) for b in str(marker).encode()) + "]),'utf8')"
    weights = json.loads(next(d for r, d in _entries(data) if r == "data/weights/model_weights_config.json"))
    name = next(iter(weights["config"]))
    evil = f'{name.rsplit(".", 1)[0]}.w", getattr(__import__("os"), "mkdir")({path})) or getattr(self, "x'
    old, new = json.dumps(name), json.dumps(evil)
    return _rewrite(data, lambda rel, d: d.replace(old.encode(), new.encode()) if rel.endswith(".json") else d)


def _entries(data: bytes) -> list[tuple[str, bytes]]:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return [(i.filename.split("/", 1)[1], z.read(i.filename)) for i in z.infolist()]


# (attack, what the reader says: None = loads with the field ignored)
ATTACKS: list[tuple[Callable[..., bytes], str | None]] = [
    (pickled_opaque_constant, r"data/constants/opaque_obj_0: an opaque constant \(a pickled Python object\)"),
    (pickled_tensor_constant, r"data/constants/tensor_9 \('evil'\): stored pickled"),
    (guards_code, None),
    (symbolic_size, r"models/model.json graph_module tensor_values .*: a symbolic expression"),
    (parameter_name, r"is not a plain dotted name"),
]
IDS = [a.__name__ for a, _ in ATTACKS]


def _torch_runs_it(data: bytes, marker: Path, batch: Any) -> None:
    """Torch's own reader runs the archive's code (at load, building the module, or calling it)."""
    logging.getLogger("torch._export.serde.serialize").disabled = True
    try:
        module = torch.export.load(io.BytesIO(data)).module()
        module(batch)
    except Exception:  # noqa: BLE001 - the code ran before whatever failed
        pass
    finally:
        logging.getLogger("torch._export.serde.serialize").disabled = False
    assert marker.exists(), "the archive is not hostile under torch's own loader"
    marker.rmdir()


# the server --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("attack", "refusal"), ATTACKS, ids=IDS)
def test_hostile_archive_on_the_server(tmp_path: Path, server: EmulatorServer,
                                       attack: Callable[..., bytes], refusal: str | None) -> None:
    marker = tmp_path / "pwned"
    batches = mlp_batches(3)
    ep, spec = torch.export.export(MLP(), (batches[0],)), make_spec()
    data = attack(save_program(ep), marker, batches[0])
    _torch_runs_it(data, marker, batches[0])
    with connect_when_free(server, f"hostile-{attack.__name__}") as dev:
        blob = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        request = dev._request("ok", {"op": "load", "spec": spec.to_json()}, [blob])
        if refusal is None:
            request.result()
            assert dev.submit(batches[0]).result()["loss"].dim() == 0
        else:
            with pytest.raises(SpecError, match=f"^{FROM_CLIENT}: .*{refusal}") as caught:
                request.result()
            assert "\n" not in str(caught.value)
        assert not marker.exists()
        dev.load(ep, spec)  # the session goes on
        assert all(dev.submit(b).result()["loss"].dim() == 0 for b in batches)
    assert not marker.exists()


# the compile cache's reuse path -----------------------------------------------------------------


def _tamper_compile_dir(directory: str, attack: Callable[..., bytes], marker: Path, batch: Any) -> bytes:
    """Replace cs_*/program.pt2 with the attack and update COMPLETE's digest and size, as an
    attacker with write access to model_dir would."""
    path = os.path.join(directory, "program.pt2")
    with open(path, "rb") as f:
        data = attack(f.read(), marker, batch)
    with open(path, "wb") as f:
        f.write(data)
    with open(os.path.join(directory, "COMPLETE")) as f:
        complete = json.load(f)
    complete["files"]["program.pt2"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    with open(os.path.join(directory, "COMPLETE"), "w") as f:
        json.dump(complete, f)
    return data


@pytest.mark.parametrize(("attack", "refusal"), ATTACKS, ids=IDS)
def test_hostile_archive_in_the_compile_cache(tmp_path: Path, attack: Callable[..., bytes],
                                              refusal: str | None) -> None:
    marker = tmp_path / "pwned"
    model, batch = DeepMLP(), DeepMLP.batch()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    first = compile_only(model, batch, settings=SETTINGS, optimizer=opt, model_dir=str(tmp_path / "model_dir"))
    assert first.ok and first.directory
    data = _tamper_compile_dir(first.directory, attack, marker, batch)
    program_path = os.path.join(first.directory, "program.pt2")
    _torch_runs_it(data, marker, batch)  # with the archive's placeholder weights

    # the chief's "Reusing the compile": a fast hit by source key, then the program is loaded
    again = compile_only(model, batch, settings=SETTINGS, optimizer=opt, model_dir=str(tmp_path / "model_dir"))
    assert again.cache_hit and again.program is None and again.directory == first.directory
    if refusal is None:
        program, spec = load_program(again.directory, weights=model.state_dict())
        device = EmbeddedDevice()
        try:
            device.load(program, spec)
            assert device.submit(batch).result()["loss"].dim() == 0
        finally:
            device.close()
        module_with_weights(again.exported_program(), model.state_dict())(batch)
    else:
        with pytest.raises(UnsafeProgram, match=f"^{program_path}: .*{refusal}") as caught:
            again.exported_program()
        assert "\n" not in caught.value.what
    assert not marker.exists()


# tied weights, and a normal program ------------------------------------------------------------


class TiedLM(nn.Module):
    """An embedding tied to the output projection (as BERT's MLM head and GPT-2's LM head) around
    an untied middle layer. Shaped for these tests, which check the names the state keeps (the tie
    and ``mid``); the traced-forward tests' TiedLM is the tie alone."""

    def __init__(self, vocab: int = 32, d: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.mid = nn.Linear(d, d)
        self.out = nn.Linear(d, vocab, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = self.out(torch.tanh(self.mid(self.emb(batch["input_ids"]))))
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1))


def _train(device: Any, program: torch.export.ExportedProgram, spec: Any, batches: list) -> tuple[list, dict]:
    with device as dev:
        dev.load(program, spec)
        losses = [h.result()["loss"] for h in [dev.submit(b) for b in batches]]
        return losses, dev.state_dict()


def test_tied_weights_stay_tied_on_the_server(server: EmulatorServer) -> None:
    """torch's reader gives each tied name its own Parameter; the graph reads only one of them
    (out.weight), so the device's state reported emb.weight untrained, which a checkpoint or the
    coherent model state then wrote over the trained tie."""
    torch.manual_seed(0)
    model, batches = TiedLM(), lm_batches(6)
    ep, spec = torch.export.export(model, (batches[0],)), make_spec()
    assert ep.state_dict["emb.weight"] is ep.state_dict["out.weight"]
    remote_losses, remote = _train(connect_when_free(server, "tied"), ep, spec, batches)
    local_losses, local = _train(EmbeddedDevice(), ep, spec, batches)
    eager, trained = eager_losses(model, batches, lambda ps: torch.optim.SGD(ps, lr=0.01), lambda _s: 0.01)
    assert [x.item() for x in remote_losses] == [x.item() for x in local_losses]
    assert remote_losses[-1].item() == pytest.approx(eager[-1], abs=1e-6)
    assert sorted(remote["params"]) == sorted(local["params"]) == ["emb.weight", "mid.bias", "mid.weight"]
    for name, value in local["params"].items():
        assert torch.equal(remote["params"][name], value), name
    assert torch.allclose(remote["params"]["emb.weight"], trained.out.weight, atol=1e-6)


def test_tied_weights_stay_tied_through_the_compile_cache(tmp_path: Path) -> None:
    model, batch = TiedLM(), lm_batches(1)[0]
    r = compile_only(model, batch, settings=SETTINGS, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                     model_dir=str(tmp_path))
    program, _ = load_program(r.directory, weights=model.state_dict())
    assert program.state_dict["emb.weight"] is program.state_dict["out.weight"]
    assert [n for n, _ in program.module().named_parameters()] == ["emb.weight", "mid.weight", "mid.bias"]


@pytest.mark.parametrize("which", ["mlp", "transformer"])
def test_normal_program_trains_bit_identically(which: str, server: EmulatorServer) -> None:
    torch.manual_seed(0)
    model, batches = (MLP(), mlp_batches(5)) if which == "mlp" else (TinyTransformer(), lm_batches(5))
    ep, spec = torch.export.export(model, (batches[0],)), make_spec()
    data = save_program(ep)
    logging.getLogger("torch._export.serde.serialize").disabled = True
    try:
        torch_read = torch.export.load(io.BytesIO(data))  # what the server loaded before: torch's reader
    finally:
        logging.getLogger("torch._export.serde.serialize").disabled = False
    ours = read_archive(data)
    assert str(ours.graph) == str(torch_read.graph)
    runs = [_train(EmbeddedDevice(), torch_read, spec, batches), _train(EmbeddedDevice(), ours, spec, batches),
            _train(connect_when_free(server, f"plain-{which}"), ep, spec, batches)]
    reference_losses, reference = runs[0]
    for losses, state in runs[1:]:
        assert [x.item() for x in losses] == [x.item() for x in reference_losses]
        assert sorted(state["params"]) == sorted(reference["params"])
        for name, value in reference["params"].items():
            assert torch.equal(state["params"][name], value), name


# what the reader never does ---------------------------------------------------------------------


def test_reading_never_unpickles_or_evaluates(monkeypatch: pytest.MonkeyPatch) -> None:
    import sympy
    import torch.export._unlift as unlift

    batch = lm_batches(1)[0]
    buf = io.BytesIO()
    torch.export.save(torch.export.export(TinyTransformer(), (batch,)), buf)  # torch's writer: pickled sample inputs
    data = _rewrite(buf.getvalue(), _edit_json("models/model.json", lambda doc: doc.update(guards_code=["True"])))

    def no(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("unpickling or evaluating attempted")

    for owner, name in ((pickle, "loads"), (pickle, "load"), (pickle, "Unpickler"), (torch, "load"),
                        (torch._C, "_pickle_load_obj"), (sympy, "sympify"), (unlift, "_convert_guards_code_to_fn")):
        monkeypatch.setattr(owner, name, no)
    program = read_archive(data)
    assert program.example_inputs is None and program._guards_code == []
    program.module()(batch)  # building and calling the module evaluates nothing from the archive either
    monkeypatch.undo()
    # and csrun's writer leaves no pickle in the archive at all
    written = dict(_entries(save_program(program)))
    assert written["data/sample_inputs/model.pt"] == b""


@pytest.mark.parametrize(("edit", "message"), [
    (lambda rel, d: d, None),
    (lambda rel, d: None if rel == "models/model.json" else d, "models/model.json: missing"),
    (lambda rel, d: d.replace(b'"torch.ops.aten.linear.default"', b'"torch.os.mkdir"') if rel == "models/model.json" else d,
     "operator 'torch.os.mkdir' is not an aten/prims operator"),
    (lambda rel, d: d.replace(b'"torch.ops.aten.linear.default"', b'"torch.ops.aten.from_file.default"')
     if rel == "models/model.json" else d, "operator 'torch.ops.aten.from_file.default'"),
    (lambda rel, d: d[:-8] if rel == "data/weights/weight_0" else d, "reaches past the"),
    (lambda rel, d: d.replace(b'"forward_arg_names": ["batch"]', b'"forward_arg_names": ["batch=0"]')
     if rel == "models/model.json" else d, "'batch=0' is not a Python identifier"),
], ids=["plain", "no-graph", "os-target", "from-file", "short-weights", "arg-name"])
def test_refusals_name_the_archive_and_the_field(tmp_path: Path, edit: Callable, message: str | None) -> None:
    data = _rewrite(save_program(torch.export.export(MLP(), (mlp_batches(1)[0],))), edit)
    path = tmp_path / "program.pt2"
    path.write_bytes(data)
    if message is None:
        read_archive(str(path))
        return
    with pytest.raises(ArchiveRefused) as caught:
        read_archive(str(path))
    text = str(caught.value)
    assert text.startswith(f"{path}: ") and message in text and "\n" not in text, text
    with pytest.raises(ArchiveRefused, match=f"^{FROM_CLIENT}: "):
        read_archive(data)


_WRITE_TWICE = """
import io, sys, zipfile, torch
from torch import nn
from csrun.program.archive import write_archive, read_archive
model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
program = torch.export.export(model, (torch.randn(5, 4),))
def entries():
    out = io.BytesIO()
    write_archive(program, out)
    z = zipfile.ZipFile(io.BytesIO(out.getvalue()))
    read_archive(out.getvalue())  # the reader takes it
    return {n.split("/", 1)[1]: z.read(n) for n in z.namelist() if not n.endswith("serialization_id")}
before = "torch._inductor.ir" in sys.modules
first = entries()
after = "torch._inductor.ir" in sys.modules
import torch._inductor.ir  # the real module: torch's own path
print(before, after, entries() == first, sys.modules["torch._inductor.ir"].__file__.endswith("ir.py"))
"""


def test_a_write_without_inductor_loaded_is_the_same_archive_and_leaves_no_trace() -> None:
    """The writer answers torch's "is this an inductor buffer?" without importing inductor's IR
    module (csrun.program.archive._without_inductor_ir): the archive is the one torch's own path
    writes, entry for entry, and the module is still not loaded afterwards."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _WRITE_TWICE], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "False", "True", "True"]
