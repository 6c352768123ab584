"""No drift between what params_train.yaml says, the compiled spec and the engine's optimizer.

For every optimizer type the params accept (and AdamW without bias correction), the epsilon,
betas and weight decay the runner writes must be what the engine's torch optimizer runs with.
Before csrun.program.optimizers, defaults were stripped on the way to the compiler: the yaml said
eps 1e-8 while LAMB, AdamW-without-bias-correction and Adadelta ran 1e-6 and Adagrad 1e-10, and
AdamW ran torch's weight_decay 0.01 while the yaml said 0.0.
"""

from __future__ import annotations

import copy

import pytest
import torch
import yaml

from csrun.compiler.settings import settings_from_params
from csrun.emulator.optimizers import build_optimizer
from csrun.program.optimizers import UPDATE_KEYS, default_eps
from csrun.run.params import params_from_dict
from csrun.run.runner import settings_input
from tests.conftest import REPO

BASE = yaml.safe_load((REPO / "configs" / "fc_mnist_debug.yaml").read_text())
BASE["model"] = {"mixed_precision": False}  # the generic sections (fc_mnist's own keys belong to its run.py)
for _name in ("train_input", "eval_input"):
    BASE[_name].pop("data_source", None)
CASES = [(t, {}) for t in UPDATE_KEYS] + [("adamw", {"correct_bias": False})]


def engine_group(section: dict) -> tuple[dict, dict]:
    """(the optimizer section as params_train.yaml records it, the engine optimizer's param group)."""
    doc = copy.deepcopy(BASE)
    doc["optimizer"] = {"learning_rate": 0.01, **section}
    params = params_from_dict(doc)
    written = params.to_dict()["optimizer"]
    spec = settings_from_params(settings_input(params), mode="train").optimizer
    assert spec is not None
    model = torch.nn.Linear(3, 2)
    opt = build_optimizer(spec.type, dict(spec.hyperparameters), list(model.named_parameters()), lr=0.01)
    return written, opt.param_groups[0]


@pytest.mark.parametrize("kind, extra", CASES, ids=[f"{t}{'-nobias' if e else ''}" for t, e in CASES])
def test_params_yaml_and_the_engine_agree(kind: str, extra: dict) -> None:
    written, group = engine_group({"optimizer_type": kind, **extra})
    if "eps" in group and not isinstance(group["eps"], tuple):
        assert written["eps"] == group["eps"], f"{kind}: yaml eps {written['eps']} vs engine {group['eps']}"
        assert written["eps"] == default_eps(kind, correct_bias=extra.get("correct_bias", True))
    else:
        assert written["eps"] is None
    if "weight_decay" in group:
        assert written["weight_decay_rate"] == group["weight_decay"], f"{kind}: weight decay drifted"
    if "betas" in group and kind != "adafactor":
        assert (written["beta1"], written["beta2"]) == tuple(group["betas"])


def test_an_explicit_eps_reaches_the_engine() -> None:
    written, group = engine_group({"optimizer_type": "lamb", "eps": 1e-7})
    assert written["eps"] == group["eps"] == 1e-7


def test_every_optimizer_type_has_its_update_keys() -> None:
    from csrun.run.params import OptimizerType

    assert set(UPDATE_KEYS) == set(OptimizerType.__args__)  # type: ignore[attr-defined]


def test_loss_scaling_defaults_are_written_once() -> None:
    """The params, the spec, the engine's scaler and cbtorch.amp.GradScaler start from one table."""
    import dataclasses
    import inspect
    import re

    from csrun.compiler.spec import LossScalingSpec
    from csrun.emulator.loss_scaling import LossScaler
    from csrun.program import loss_scaling as table
    from csrun.run.params import OptimizerConfig
    from csrun.torch.amp import GradScaler

    want = {"initial_loss_scale": table.INITIAL_LOSS_SCALE, "steps_per_increase": table.STEPS_PER_INCREASE,
            "min_loss_scale": table.MIN_LOSS_SCALE, "max_loss_scale": table.MAX_LOSS_SCALE}
    params = {f.name: f.default for f in dataclasses.fields(OptimizerConfig)}
    spec = {f.name: f.default for f in dataclasses.fields(LossScalingSpec)}
    engine = {k: v.default for k, v in inspect.signature(LossScaler.__init__).parameters.items()}
    amp = {k: v.default for k, v in inspect.signature(GradScaler.__init__).parameters.items()}
    amp["initial_loss_scale"] = amp.pop("init_scale")
    for name, value in want.items():
        assert params[name] == spec[name] == engine[name] == amp[name] == value, name
    package = REPO / "csrun"
    literal = re.compile(r"2\.0\s*\*\*\s*(15|24)\b")
    home = package / "program" / "loss_scaling.py"
    found = [str(p.relative_to(REPO)) for p in package.rglob("*.py") if p != home and literal.search(p.read_text())]
    assert found == [], f"loss-scale literals outside csrun/program/loss_scaling.py: {found}"
