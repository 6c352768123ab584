"""compile_only end to end: models, artifacts, eager-equal autograd, fit, cache, safe loading."""

from __future__ import annotations

import json
import os
import re
import pickle
import shutil
import zipfile
from dataclasses import replace

import pytest
import torch

from csrun.compiler import (
    CompileSettings, WaferSpec, compile_only, exit_code, has_weight_values, load_program, module_with_weights,
    validate_only,
)
from csrun.compiler.cache.program_io import bind_weights, load_exported_program
from csrun.compiler.errors import ModelDoesNotFit, UnsafeProgram
from csrun.compiler.report import MSG_COMPILING, MSG_FAILED, MSG_TRAIN_OK

from tests.tiny_models import ConvNet, DeepMLP, TinyBert, TinyGPT

from .helpers import console

SETTINGS = CompileSettings(mode="train", learning_rate=1e-3)
MODELS = [DeepMLP, ConvNet, TinyBert, TinyGPT]


def _adam(m: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(m.parameters(), lr=1e-3)


@pytest.mark.parametrize("model_cls", MODELS, ids=[m.__name__ for m in MODELS])
def test_models_compile_and_round_trip(model_cls: type, tmp_path) -> None:  # noqa: ANN001
    torch.manual_seed(0)
    model, batch = model_cls(), model_cls.batch()
    con, buf = console()
    r = compile_only(model, batch, settings=SETTINGS, optimizer=_adam(model), model_dir=str(tmp_path), console=con)
    stamped = buf.getvalue()
    out = re.sub(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ", "", stamped, flags=re.M)  # off a terminal: the time first
    assert out != stamped and r.ok and exit_code(r) == 0, [p.render() for p in r.problems]
    assert out.startswith(MSG_COMPILING) and out.rstrip().endswith(MSG_TRAIN_OK)
    assert "estimate" in out.lower() and "samples/s" in out
    assert os.path.basename(r.directory).startswith("cs_") and os.path.dirname(r.directory) == str(tmp_path)
    assert sorted(os.listdir(r.directory)) == ["COMPLETE", "estimate.json", "plan.json", "program.pt2", "report.txt", "spec.json"]
    plan = json.load(open(os.path.join(r.directory, "plan.json")))
    est = json.load(open(os.path.join(r.directory, "estimate.json")))
    assert 0 < plan["total_utilization"] <= 1 and plan["layers"] and plan["estimate"] is True
    assert est["est_samples_per_sec"] > 0
    assert "ESTIMATES" in open(os.path.join(r.directory, "report.txt")).read()

    # Autograd through the loaded program's module equals eager (dropout-free models).
    program, spec = load_program(r.directory)
    assert spec == r.spec and spec.optimizer.type == "adamw"
    assert os.path.getsize(os.path.join(r.directory, "program.pt2")) < 2_000_000  # graph, not weights
    assert not has_weight_values(program) and has_weight_values(r.program)
    gm = module_with_weights(program, model.state_dict())
    assert has_weight_values(program)
    bound, _ = load_program(r.directory, weights=model.state_dict())
    torch.testing.assert_close(bound.module()(batch), gm(batch))
    model.train()
    eager_out = model(batch)
    prog_out = gm(batch)
    eager_loss = eager_out["loss"] if isinstance(eager_out, dict) else eager_out
    prog_loss = prog_out["loss"] if isinstance(prog_out, dict) else prog_out
    torch.testing.assert_close(prog_loss, eager_loss)
    eager_loss.backward()
    prog_loss.backward()
    eager_grads = {n: p.grad for n, p in model.named_parameters()}
    for n, p in gm.named_parameters():
        torch.testing.assert_close(p.grad, eager_grads[n], msg=n)


def _need_bytes(tmp_path) -> float:  # noqa: ANN001
    m = DeepMLP(hidden=64)
    r = compile_only(m, DeepMLP.batch(), settings=SETTINGS, optimizer=_adam(m), model_dir=str(tmp_path / "probe"))
    return r.plan.sram_needed_bytes


def test_fit_just_under_and_just_over(tmp_path) -> None:  # noqa: ANN001
    need = _need_bytes(tmp_path)
    small = WaferSpec(name="tiny", num_pes=2000, sram_bytes=int(need * 1.05))
    m = DeepMLP(hidden=64)
    r = compile_only(m, DeepMLP.batch(), settings=SETTINGS, optimizer=_adam(m), model_dir=str(tmp_path), wafer=small)
    assert r.ok and r.plan.fits and r.plan.memory_utilization > 0.9
    too_small = replace(small, sram_bytes=int(need * 0.95))
    con, buf = console()
    r = compile_only(m, DeepMLP.batch(), settings=SETTINGS, optimizer=_adam(m), model_dir=str(tmp_path), wafer=too_small,
                     console=con)
    assert not r.ok and exit_code(r) == 1 and r.directory is None
    [p] = r.problems
    assert isinstance(p, ModelDoesNotFit)
    assert f"{need:,.0f} bytes" in p.render() and f"{int(need * 0.95):,} bytes" in p.render()
    assert "Biggest layers: body.0" in p.render() or "Biggest layers: body.2" in p.render()
    assert buf.getvalue().rstrip().endswith(MSG_FAILED)


def test_cache_hit_miss_and_half_written(tmp_path) -> None:  # noqa: ANN001
    d = str(tmp_path)
    m = DeepMLP()
    first = compile_only(m, DeepMLP.batch(), settings=SETTINGS, optimizer=_adam(m), model_dir=d)
    assert first.ok and not first.cache_hit
    con, buf = console()
    fast = compile_only(m, DeepMLP.batch(), settings=SETTINGS, optimizer=_adam(m), model_dir=d, console=con)
    assert fast.cache_hit and fast.directory == first.directory and fast.program is None
    assert "Reusing the compile in" in buf.getvalue() and "Placement on WSE-2 (estimate)" in buf.getvalue()
    assert fast.plan.total_utilization == first.plan.total_utilization
    assert fast.estimate_json["est_samples_per_sec"] == first.estimate_json["est_samples_per_sec"]
    again = compile_only(m, DeepMLP.batch(), settings=SETTINGS, optimizer=_adam(m), model_dir=d, reuse_by_source=False)
    assert again.cache_hit and again.directory == first.directory and again.program is not None
    m.note = "a new attribute changes the source key, not the graph"
    same_graph = compile_only(m, DeepMLP.batch(), settings=SETTINGS, optimizer=_adam(m), model_dir=d)
    assert same_graph.cache_hit and same_graph.program is not None  # captured, then found by compile key
    fast_again = compile_only(m, DeepMLP.batch(), settings=SETTINGS, optimizer=_adam(m), model_dir=d)
    assert fast_again.cache_hit and fast_again.program is None  # its source key was recorded

    # A changed hyperparameter or a changed graph compiles anew.
    other_opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.5)
    hp = compile_only(m, DeepMLP.batch(), settings=SETTINGS, optimizer=other_opt, model_dir=d)
    assert not hp.cache_hit and hp.directory != first.directory
    deeper = DeepMLP(depth=3)
    graph = compile_only(deeper, DeepMLP.batch(), settings=SETTINGS, optimizer=_adam(deeper), model_dir=d, reuse_by_source=False)
    assert not graph.cache_hit and graph.directory not in (first.directory, hp.directory)

    # A half-written directory (no marker, truncated program) is rebuilt, never reused.
    os.remove(os.path.join(first.directory, "COMPLETE"))
    with open(os.path.join(first.directory, "program.pt2"), "r+b") as f:
        f.truncate(100)
    with pytest.raises(UnsafeProgram, match="not a complete compile directory"):
        load_program(first.directory)
    rebuilt = compile_only(m, DeepMLP.batch(), settings=SETTINGS, optimizer=_adam(m), model_dir=d)
    assert rebuilt.ok and not rebuilt.cache_hit and rebuilt.directory == first.directory
    load_program(rebuilt.directory)
    assert not [e for e in os.listdir(d) if e.startswith(".")]  # no temp dirs left behind


class _Evil:
    def __reduce__(self):  # noqa: ANN204
        return (open, (os.environ["CSRUN_EVIL_MARKER"], "w"))


def test_program_loads_weights_only_and_crafted_archive_refused(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    m = DeepMLP()
    r = compile_only(m, DeepMLP.batch(), settings=SETTINGS, optimizer=_adam(m), model_dir=str(tmp_path))

    class NoFullUnpickling(pickle.Unpickler):
        def __init__(self, *a, **k) -> None:  # noqa: ANN002, ANN003
            raise AssertionError("full unpickling attempted")

    with monkeypatch.context() as mp:
        mp.setattr(pickle, "Unpickler", NoFullUnpickling)
        mp.setattr(pickle, "loads", NoFullUnpickling)
        mp.setattr(pickle, "load", NoFullUnpickling)
        program, _ = load_program(r.directory)
    assert set(program.state_dict) == set(m.state_dict())
    assert {k: (v.shape, v.dtype) for k, v in program.state_dict.items()} == {k: (v.shape, v.dtype) for k, v in m.state_dict().items()}

    # Craft: mark one weight as pickled and replace its bytes with a pickle that runs code.
    marker = tmp_path / "pwned"
    monkeypatch.setenv("CSRUN_EVIL_MARKER", str(marker))
    src = os.path.join(r.directory, "program.pt2")
    evil = str(tmp_path / "evil.pt2")
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(evil, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)
            if info.filename.endswith("model_weights_config.json"):
                cfg = json.loads(data)
                first = next(iter(cfg["config"].values()))
                first["use_pickle"] = True
                evil_name = info.filename.rsplit("/", 1)[0] + "/" + first["path_name"]
                data = json.dumps(cfg).encode()
            zout.writestr(info, data)
    with zipfile.ZipFile(evil) as z:
        names = z.namelist()
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(evil + ".2", "w") as zout:
        for name in names:
            if name == evil_name:
                zout.writestr(name, _evil_pickle())
            elif name.endswith("model_weights_config.json"):
                with zipfile.ZipFile(evil) as z:
                    zout.writestr(name, z.read(name))
            else:
                zout.writestr(name, zin.read(name))
    with pytest.raises(UnsafeProgram, match="weights-only"):
        load_exported_program(evil + ".2")
    assert not marker.exists()

    # The same archive placed in a compile directory is refused by its checksum first.
    shutil.copy(evil + ".2", src)
    with pytest.raises(UnsafeProgram, match="checksum"):
        load_program(r.directory)
    assert not marker.exists()


def _evil_pickle() -> bytes:
    import io
    buf = io.BytesIO()
    torch.save({"w": _Evil()}, buf)
    return buf.getvalue()


def test_validate_only_messages_and_exit_codes(tmp_path) -> None:  # noqa: ANN001
    con, buf = console()
    ok = validate_only(DeepMLP(), DeepMLP.batch(), settings=SETTINGS, console=con)
    assert ok.ok and exit_code(ok) == 0 and ok.plan is None and ok.directory is None
    first = buf.getvalue().splitlines()[0]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d " + re.escape(MSG_COMPILING), first), first
    assert "Validation completed successfully!" in buf.getvalue()
    con, buf = console()
    bad = validate_only(DeepMLP(), DeepMLP.batch(), settings=CompileSettings(grad_accum_steps=3), console=con)
    assert exit_code(bad) == 1 and buf.getvalue().rstrip().endswith(MSG_FAILED)
    assert "Gradient Accumulation not supported on CS workflow." in buf.getvalue()
    assert not os.listdir(tmp_path)


def test_archive_with_opaque_or_unknown_entries_refused(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("CSRUN_EVIL_MARKER", str(tmp_path / "pwned"))
    m = DeepMLP()
    r = compile_only(m, DeepMLP.batch(), settings=SETTINGS, optimizer=_adam(m), model_dir=str(tmp_path))
    src = os.path.join(r.directory, "program.pt2")
    for extra, why in (("data/constants/opaque_obj_0", "opaque"), ("data/constants/custom_obj_0", "custom"),
                       ("code/payload.py", "unexpected entry")):
        bad = str(tmp_path / f"bad-{why.replace(' ', '_')}.pt2")
        with zipfile.ZipFile(src) as zin, zipfile.ZipFile(bad, "w") as zout:
            prefix = zin.namelist()[0].split("/", 1)[0]
            for info in zin.infolist():
                zout.writestr(info, zin.read(info.filename))
            zout.writestr(f"{prefix}/{extra}", pickle.dumps(_Evil()))
        with pytest.raises(UnsafeProgram, match=why):
            load_exported_program(bad)
    assert not (tmp_path / "pwned").exists()


def test_bind_weights_checks_shapes(tmp_path) -> None:  # noqa: ANN001
    m = DeepMLP()
    r = compile_only(m, DeepMLP.batch(), settings=SETTINGS, optimizer=_adam(m), model_dir=str(tmp_path))
    program, _ = load_program(r.directory)
    wrong = dict(DeepMLP(hidden=8).state_dict())
    with pytest.raises(ValueError, match="body.0.weight"):
        bind_weights(program, wrong)
    with pytest.raises(KeyError):
        bind_weights(program, {})
