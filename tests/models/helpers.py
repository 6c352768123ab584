"""Shared helpers for the reference-model tests: load a model's sibling modules, its configs, debug batches."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import yaml

from csrun.run.params import Params, params_from_dict

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "models"
CONFIGS = REPO / "configs"


def load_module(model: str, name: str) -> ModuleType:
    """``models/<model>/<name>.py`` as module ``<model>_<name>`` (run.py imports them as siblings)."""
    key = f"csrun_test_{model}_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, MODELS / model / f"{name}.py")
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load models/{model}/{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module  # dataclass type hints are resolved through sys.modules
    spec.loader.exec_module(module)
    return module


def load_params(config: str, model_config: type, input_config: type) -> Params:
    """``configs/<config>.yaml`` as typed params."""
    data = yaml.safe_load((CONFIGS / f"{config}.yaml").read_text())
    return params_from_dict(data, model_config=model_config, input_config=input_config)


def first_batch(loader: Any) -> dict[str, torch.Tensor]:
    """The first batch of a DataLoader."""
    return next(iter(loader))


def train_losses(model: torch.nn.Module, loader: Any, steps: int, lr: float) -> list[float]:
    """Eager AdamW training for ``steps`` steps over (repeated) ``loader``; the loss of every step."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    losses: list[float] = []
    model.train()
    while len(losses) < steps:
        for batch in loader:
            loss = model(batch)["loss"]
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(float(loss.detach()))
            if len(losses) == steps:
                break
    return losses


def check_scalar_outputs(out: dict[str, torch.Tensor]) -> None:
    """The runner's contract: a dict of float scalar tensors, ``loss`` first, all finite."""
    assert next(iter(out)) == "loss"
    for name, value in out.items():
        assert isinstance(value, torch.Tensor) and value.dim() == 0, name
        assert value.is_floating_point() and torch.isfinite(value), name


def check_grads(model: torch.nn.Module) -> None:
    """Every parameter got a finite, non-zero gradient."""
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name}: no gradient"
        assert torch.isfinite(p.grad).all(), f"{name}: non-finite gradient"
        assert p.grad.abs().sum() > 0, f"{name}: zero gradient"
