"""Training semantics have one home (csrun/program): what params_train.yaml says is what runs.

For every optimizer type (and AdamW without bias correction) the epsilon, betas and the other
hyperparameter defaults are the same in the params_train.yaml the runner writes, the compiled
spec (compile settings -> ProgramSpec, through its JSON) and the engine's torch optimizer; the
loss-scale defaults are the same in the params, the spec and the engine. No other module keeps
its own optimizer-name list or legacy-key mapping, so drift cannot come back.

The drift these catch: defaults were stripped on the way to the compiler, so the yaml said eps
1e-8 while LAMB, AdamW-without-bias-correction and Adadelta ran 1e-6 and Adagrad 1e-10, and AdamW
ran torch's weight_decay 0.01 while the yaml said 0.0; a params dict given to the compiler
directly (without the typed params) still ran torch's defaults.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from csrun.compiler.optim import optimizer_spec_from_params
from csrun.compiler.settings import settings_from_params
from csrun.errors import ConfigError
from csrun.compiler.spec import LossScalingSpec, ProgramSpec
from csrun.emulator.engine.executor import Engine
from csrun.emulator.engine.loss_scaling import LossScaler
from csrun.program.optimizer_classes import AdamWNoBiasCorrection
from csrun.program import loss_scaling as scaling_table
from csrun.program import optimizer_config
from csrun.program import optimizers as table
from csrun.run.params import OptimizerConfig, params_from_dict
from csrun.run.runner import compile_settings
from csrun.run.summaries import write_params
from tests.conftest import REPO
from tests.run.conftest import DEBUG_YAML, _one_thread, fc_mnist  # noqa: F401  (fixtures)
from tests.tiny_models import LinearClassifier

BASE = yaml.safe_load((REPO / "configs" / "fc_mnist_debug.yaml").read_text())
BASE["model"] = {"mixed_precision": False}  # the generic sections (fc_mnist's own keys belong to its run.py)
for _name in ("train_input", "eval_input"):
    BASE[_name].pop("data_source", None)
CASES = [(t, {}) for t in table.NAMES] + [("adamw", {"correct_bias": False})]
IDS = [f"{t}{'-nobias' if e else ''}" for t, e in CASES]
TORCH_NAME = {"weight_decay_rate": "weight_decay"}
"""A legacy key -> the param-group key it becomes (beta1/beta2 are checked as betas)."""

_PROGRAM: list[torch.export.ExportedProgram] = []


def _program() -> torch.export.ExportedProgram:
    """A tiny exported model (exported once: the engine copies its weights)."""
    if not _PROGRAM:
        batch = (torch.ones(4, 3), torch.zeros(4, dtype=torch.int64))
        _PROGRAM.append(torch.export.export(LinearClassifier(3, 2, seed=0), (batch,)))
    return _PROGRAM[0]


def run_all_three(section: dict[str, Any], tmp_path: Path) -> tuple[dict, ProgramSpec, Engine]:
    """(params_train.yaml's optimizer section as the runner writes it, the compiled spec, the engine)."""
    doc = copy.deepcopy(BASE)
    doc["optimizer"] = {"learning_rate": 0.01, **section}
    params = params_from_dict(doc)
    written = yaml.safe_load(write_params(tmp_path, "train", params.to_dict()).read_text())["optimizer"]
    settings = compile_settings(params, mode="train")  # what the runner hands the compiler
    spec = ProgramSpec.from_json(settings.program_spec(inputs=(), input_tree="", outputs=("loss",)).to_json())
    return written, spec, Engine(_program(), spec, notice=lambda _: None)


@pytest.mark.parametrize("kind, extra", CASES, ids=IDS)
def test_params_yaml_spec_and_engine_agree(kind: str, extra: dict, tmp_path: Path) -> None:
    written, spec, engine = run_all_three({"optimizer_type": kind, **extra}, tmp_path)
    assert engine.optimizer is not None
    group = engine.optimizer.param_groups[0]
    hp = spec.optimizer.hyperparameters  # type: ignore[union-attr]
    eps = table.default_eps(kind, correct_bias=extra.get("correct_bias", True))
    assert written["eps"] == eps, f"{kind}: params_train.yaml eps {written['eps']} is not the type's {eps}"
    if eps is not None:
        assert (hp.get("eps"), group["eps"]) == (eps, eps), f"{kind}: yaml eps {eps}, spec {hp.get('eps')}, engine {group['eps']}"
    for key in table.OPTIMIZERS[kind].update_keys:
        if key in ("beta1", "beta2"):
            assert (written["beta1"], written["beta2"]) == tuple(hp["betas"]) == tuple(group["betas"]), kind
        elif key != "eps":
            name = TORCH_NAME.get(key, key)
            if key == "correct_bias":  # the engine's class says it
                engine_value = not isinstance(engine.optimizer, AdamWNoBiasCorrection)
            else:
                engine_value = group[name]
            assert written[key] == hp[name] == engine_value, f"{kind}.{key}: yaml {written[key]}, spec {hp[name]}, engine {engine_value}"
    if "weight_decay" in group:  # torch's AdamW default is 0.01: the params' 0.0 must win
        assert group["weight_decay"] == written["weight_decay_rate"], f"{kind}: weight decay drifted"


@pytest.mark.parametrize("section", [
    {"optimizer_type": "lamb", "loss_scaling_factor": "dynamic"},  # ran eps 1e-6 under a yaml saying 1e-8
    {"optimizer_type": "adamw", "weight_decay_rate": 0.0},  # ran torch's weight_decay 0.01 under a yaml saying 0.0
    {"optimizer_type": "adamw", "correct_bias": False},  # ran eps 1e-6 under a yaml saying 1e-8
], ids=["lamb", "adamw", "adamw-nobias"])
def test_a_run_writes_what_its_engine_runs(section: dict, fc_mnist: Any, tmp_path: Path,  # noqa: F811
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """fc_mnist for one step on the embedded device: params_train.yaml, the compile dir's spec.json
    and the engine's optimizer and scaler say the same."""
    engines: list[Engine] = []
    build = Engine.__init__

    def recording(self: Engine, *args: Any, **kwargs: Any) -> None:
        build(self, *args, **kwargs)
        engines.append(self)

    monkeypatch.setattr(Engine, "__init__", recording)
    doc = yaml.safe_load(DEBUG_YAML.read_text())
    doc["runconfig"].update(max_steps=1, checkpoint_steps=0, log_steps=1, save_losses=False)
    doc["optimizer"] = {"learning_rate": 0.01, **section}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc))
    model_dir = tmp_path / "md"
    assert fc_mnist("-p", str(tmp_path / "p.yaml"), "-m", "train", "-o", str(model_dir), "--cs_ip", "embedded") == 0
    written = yaml.safe_load((model_dir / "train" / "params_train.yaml").read_text())["optimizer"]
    [spec_json] = model_dir.glob("cs_*/spec.json")
    spec = ProgramSpec.from_json(spec_json.read_text())
    [engine] = engines
    assert engine.optimizer is not None and spec.optimizer is not None
    group, hp = engine.optimizer.param_groups[0], spec.optimizer.hyperparameters
    kind = section["optimizer_type"]
    eps = table.default_eps(kind, correct_bias=section.get("correct_bias", True))
    assert (written["eps"], hp.get("eps"), group["eps"]) == (eps, eps, eps), "eps: yaml, spec.json, engine"
    assert (written["weight_decay_rate"], hp.get("weight_decay"), group["weight_decay"]) == (0.0, 0.0, 0.0), \
        "weight decay: yaml, spec.json, engine"
    assert (written["beta1"], written["beta2"]) == tuple(hp.get("betas", ())) == tuple(group["betas"])
    ls, scaler = spec.loss_scaling, engine.scaler
    assert scaler is not None
    assert (written["initial_loss_scale"], written["min_loss_scale"], written["max_loss_scale"]) \
        == (ls.initial_loss_scale, ls.min_loss_scale, ls.max_loss_scale) \
        == (scaling_table.INITIAL_LOSS_SCALE, scaler.min_scale, scaler.max_scale)


def test_an_explicit_eps_reaches_the_engine(tmp_path: Path) -> None:
    written, spec, engine = run_all_three({"optimizer_type": "lamb", "eps": 1e-7}, tmp_path)
    assert written["eps"] == spec.optimizer.hyperparameters["eps"] == engine.optimizer.param_groups[0]["eps"] == 1e-7  # type: ignore[union-attr]


@pytest.mark.parametrize("kind, extra", CASES, ids=IDS)
def test_a_bare_params_dict_compiles_to_the_same_spec(kind: str, extra: dict) -> None:
    """settings_from_params on a YAML mapping as written fills the same defaults as the runner's typed path."""
    doc = copy.deepcopy(BASE)
    doc["optimizer"] = {"optimizer_type": kind, "learning_rate": 0.01, **extra}
    bare = settings_from_params(doc, mode="train")
    typed = compile_settings(params_from_dict(doc), mode="train")
    assert bare == typed


def test_one_reader_of_the_optimizer_section(tmp_path: Path) -> None:
    """run.py's params, the compiler's dict API and optimizer_spec_from_params accept the same keys
    (amsgrad and lr_decay reach the spec through all three) and refuse the same ones with the same message."""
    doc = copy.deepcopy(BASE)
    doc["optimizer"] = {"optimizer_type": "Adam", "learning_rate": 0.01, "amsgrad": True}
    typed = compile_settings(params_from_dict(doc), mode="train").optimizer
    assert typed == settings_from_params(doc, mode="train").optimizer == optimizer_spec_from_params(doc["optimizer"])
    assert typed is not None and typed.hyperparameters["amsgrad"] is True
    doc["optimizer"] = {"optimizer_type": "adagrad", "learning_rate": 0.01, "lr_decay": 0.5}
    assert optimizer_spec_from_params(doc["optimizer"]).hyperparameters["lr_decay"] == 0.5
    for kind, key, value in (("adam", "amsgrad", True), ("adagrad", "lr_decay", 0.5)):
        written, _, engine = run_all_three({"optimizer_type": kind, key: value}, tmp_path)
        assert engine.optimizer is not None
        assert written[key] == engine.optimizer.param_groups[0][key] == value, (kind, key)
    doc["optimizer"] = {"optimizer_type": "sgd", "learning_rate": 0.01, "epsilon": 1e-3}
    messages = []
    for read in (lambda: params_from_dict(doc), lambda: settings_from_params(doc),
                 lambda: optimizer_spec_from_params(doc["optimizer"])):
        with pytest.raises(ConfigError) as info:
            read()
        messages.append(str(info.value))
    assert "optimizer.epsilon" in messages[0] and messages.count(messages[0]) == 3, messages
    assert OptimizerConfig is optimizer_config.OptimizerConfig


def test_typed_config_defaults_are_the_tables() -> None:
    fields = {f.name: f for f in dataclasses.fields(OptimizerConfig)}
    for key, value in table.HYPERPARAMETER_DEFAULTS.items():
        assert fields[key].default == value, key
    from csrun.run import params as params_module

    assert fields["optimizer_type"].type == "OptimizerType" and params_module.OptimizerType is table.OptimizerType


def test_loss_scaling_defaults_are_written_once(tmp_path: Path) -> None:
    """The params, the spec, the engine's scaler and cbtorch.amp.GradScaler start from one table."""
    from csrun.torch.amp import GradScaler

    want = {"initial_loss_scale": scaling_table.INITIAL_LOSS_SCALE, "steps_per_increase": scaling_table.STEPS_PER_INCREASE,
            "min_loss_scale": scaling_table.MIN_LOSS_SCALE, "max_loss_scale": scaling_table.MAX_LOSS_SCALE}
    params = {f.name: f.default for f in dataclasses.fields(OptimizerConfig)}
    spec = {f.name: f.default for f in dataclasses.fields(LossScalingSpec)}
    scaler = {k: v.default for k, v in inspect.signature(LossScaler.__init__).parameters.items()}
    amp = {k: v.default for k, v in inspect.signature(GradScaler.__init__).parameters.items()}
    amp["initial_loss_scale"] = amp.pop("init_scale")
    for name, value in want.items():
        assert params[name] == spec[name] == scaler[name] == amp[name] == value, name
    written, compiled, engine = run_all_three({"optimizer_type": "sgd", "loss_scaling_factor": "dynamic"}, tmp_path)
    running = engine.scaler
    assert running is not None and compiled.loss_scaling.factor == "dynamic"
    assert (written["initial_loss_scale"], written["steps_per_increase"], written["min_loss_scale"], written["max_loss_scale"]) \
        == (compiled.loss_scaling.initial_loss_scale, compiled.loss_scaling.steps_per_increase,
            compiled.loss_scaling.min_loss_scale, compiled.loss_scaling.max_loss_scale) \
        == (running.scale, running.steps_per_increase, running.min_scale, running.max_scale) == tuple(want.values())
    package = REPO / "csrun"
    literal = re.compile(r"2\.0\s*\*\*\s*(15|24)\b")
    home = package / "program" / "loss_scaling.py"
    found = [str(p.relative_to(REPO)) for p in package.rglob("*.py") if p != home and literal.search(p.read_text())]
    assert found == [], f"loss-scale literals outside csrun/program/loss_scaling.py: {found}"


def _strings(tree: ast.AST) -> tuple[list[ast.Constant], set[int]]:
    """Every string constant of a module, and the ids of those that are docstrings or bare strings."""
    prose = {id(node.value) for node in ast.walk(tree)
             if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    consts = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return consts, prose


def test_no_other_module_lists_optimizers_or_maps_legacy_keys() -> None:
    """Only csrun/program/optimizers.py writes optimizer names as a list (a tuple, list, set,
    dict or Literal with two or more of them, or a message naming four) or maps beta1/beta2 to betas."""
    names = set(table.NAMES) | {o.class_name.lower() for o in table.OPTIMIZERS.values()}
    home = REPO / "csrun" / "program" / "optimizers.py"
    problems = []
    for path in sorted((REPO / "csrun").rglob("*.py")):
        if path == home:
            continue
        where = path.relative_to(REPO)
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            elts: list[ast.expr] | None = None
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                elts = list(node.elts)
            elif isinstance(node, ast.Dict):
                elts = [k for k in node.keys if k is not None] + list(node.values)
            if elts is not None:
                hits = {e.value.lower() for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)} & names
                if len(hits) >= 2:
                    problems.append(f"{where}:{node.lineno}: optimizer names {sorted(hits)}")
        consts, prose = _strings(tree)
        for const in consts:
            if id(const) not in prose:
                hits = {w.lower() for w in re.findall(r"[A-Za-z]+", const.value)} & names
                if len(hits) >= 4:
                    problems.append(f"{where}:{const.lineno}: a message listing optimizers {sorted(hits)}")
        values = {c.value for c in consts}
        if {"beta1", "betas"} <= values:
            problems.append(f"{where}: maps beta1/beta2 to betas (csrun.program.optimizers.torch_hyperparameters does)")
    assert problems == [], "\n".join(problems)


def test_the_table_matches_torch() -> None:
    """Each torch class exists, takes the keys its type's update reads, and defaults them as the table
    says (weight decay aside: the params' 0.0 is passed explicitly, AdamW's torch default is 0.01)."""
    for kind, entry in table.OPTIMIZERS.items():
        if not entry.in_torch:
            continue
        sig = inspect.signature(getattr(torch.optim, entry.class_name).__init__).parameters
        hp = table.torch_hyperparameters(kind, {k: table.HYPERPARAMETER_DEFAULTS.get(k) for k in entry.update_keys})
        hp.pop("correct_bias", None)
        for key, value in hp.items():
            assert key in sig, f"{kind}: torch.optim.{entry.class_name} has no {key}"
            default = sig[key].default
            if key == "eps":
                assert default == entry.eps, f"{kind}: the table's eps {entry.eps}, torch's {default}"
            elif key != "weight_decay":
                assert (list(default) if isinstance(default, tuple) else default) == value, f"{kind}.{key}"


def test_the_engines_own_classes_compile_as_their_type() -> None:
    """The runner builds AdamWNoBiasCorrection for ``correct_bias: false``: the compiler must accept it
    (it refused it as 'not one the system has') and rebuild the same class from its spec."""
    from csrun.compiler.optim import optimizer_spec_from_torch
    from csrun.program.optimizer_classes import Lamb, build_optimizer

    weight = torch.nn.Parameter(torch.ones(2))
    for made, kind in ((AdamWNoBiasCorrection([weight]), "adamw"), (Lamb([weight]), "lamb")):
        spec = optimizer_spec_from_torch(made)
        assert spec.type == kind
        rebuilt = build_optimizer(spec.type, dict(spec.hyperparameters), [("w", weight)], lr=0.1)
        assert type(rebuilt) is type(made) and rebuilt.param_groups[0]["eps"] == made.param_groups[0]["eps"]
