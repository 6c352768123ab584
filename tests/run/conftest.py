"""Fixtures for the runner tests: fc_mnist run in-process (run.py's sibling imports made
importable for the test only), one torch thread, a fresh csrun.torch state per run."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch
import yaml

from tests.conftest import REPO

FC_MNIST = REPO / "models" / "fc_mnist"
DEBUG_YAML = REPO / "configs" / "fc_mnist_debug.yaml"
FULL_YAML = REPO / "configs" / "fc_mnist.yaml"


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    old = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models on a shared 2-core machine: threads only contend
    yield
    torch.set_num_threads(old)


@pytest.fixture()
def fc_mnist(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., int]]:
    """``fc_mnist(*argv) -> exit status``: models/fc_mnist/run.py's run() called in this process."""
    monkeypatch.delenv("CS_IP", raising=False)
    monkeypatch.delenv("CSRUN_LAUNCHER", raising=False)
    for name in ("model", "data"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(FC_MNIST))  # run.py is a script: its siblings import by name
    import data  # noqa: F401  (models/fc_mnist/data.py)
    import model  # noqa: F401

    from csrun.run import run
    from csrun.torch import process_state as torch_state

    def call(*argv: str) -> int:
        torch_state.reset_for_tests()
        try:
            return run(model_fn=lambda p: model.FcMnist(p.model), train_input_fn=data.train_input_fn,
                       eval_input_fn=data.eval_input_fn, model_config=model.FcMnistConfig,
                       input_config=model.FcMnistInputConfig, eval_metrics=model.eval_metrics,
                       argv=list(argv))
        finally:
            torch_state.reset_for_tests()

    yield call
    for name in ("model", "data"):
        sys.modules.pop(name, None)


def write_yaml(path: Path, base: Path = DEBUG_YAML, **runconfig: Any) -> Path:
    """A copy of ``base`` with ``runconfig`` keys replaced."""
    data = yaml.safe_load(base.read_text())
    data["runconfig"].update(runconfig)
    path.write_text(yaml.safe_dump(data))
    return path


def diverging_yaml(path: Path, **runconfig: Any) -> Path:
    """DEBUG_YAML with a learning rate of 1e6 (the loss goes NaN or inf within a few steps) and
    ``runconfig`` keys replaced."""
    data = yaml.safe_load(DEBUG_YAML.read_text())
    data["optimizer"]["learning_rate"] = 1.0e6
    data["runconfig"].update(runconfig)
    path.write_text(yaml.safe_dump(data))
    return path


def model_tensors(ckpt: Path) -> dict[str, torch.Tensor]:
    """The model weights of a checkpoint."""
    from csrun.run.checkpoints import load_checkpoint

    return load_checkpoint(ckpt)["model"]


PERFORMANCE_KEYS = {"total_samples", "total_time", "samples_per_sec", "compile_time", "programming_time",
                    "est_samples_per_sec", "per_ordinal", "suspected_input_bottleneck"}
"""The keys performance.json must have."""


def scalars(folder: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of each TensorBoard scalar ``tag`` written under ``folder``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def assert_same_weights(a: Path, b: Path) -> None:
    """The two checkpoints hold the same model weights, bit for bit."""
    wa, wb = model_tensors(a), model_tensors(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


def fc_mnist_model_module() -> Any:
    """models/fc_mnist/model.py loaded by path (under another name: no sys.path change)."""
    import importlib.util

    name = "_fc_mnist_model_for_tests"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, FC_MNIST / "model.py")
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[name] = module
        spec.loader.exec_module(module)  # type: ignore[union-attr]
    return sys.modules[name]
