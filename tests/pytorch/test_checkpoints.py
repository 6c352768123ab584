"""A checkpoint the 2.x script writes resumes in the runner and in cbtorch, and the reverse: the
resumed run continues exactly (same losses as the run that was never stopped)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch

import csrun.pytorch as cstorch
import csrun.torch as cbtorch
from csrun.pytorch import backends as cstorch_backend
from csrun.run.summaries import read_losses as runner_losses
from csrun.torch import process_state as state_mod
from tests.pytorch.conftest import DEBUG_YAML
from tests.run.conftest import fc_mnist  # noqa: F401  (run.py's run() in this process)

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("fresh")]


@pytest.fixture()
def train_cstorch(fc_mnist: Callable[..., int]) -> Iterator[Callable[..., int]]:  # noqa: F811
    """``train_cstorch(*argv) -> exit status``: models/fc_mnist/train_cstorch.py's main() in this process."""
    import train_cstorch as script  # models/fc_mnist is on sys.path (the fc_mnist fixture)

    def call(*argv: str) -> int:
        state_mod.reset_for_tests()
        cstorch_backend.reset_for_tests()
        try:
            return script.main(["--params", str(DEBUG_YAML), *argv])
        finally:
            state_mod.reset_for_tests()
            cstorch_backend.reset_for_tests()

    yield call
    sys.modules.pop("train_cstorch", None)


def cstorch_losses(model_dir: Path) -> list[tuple[int, float]]:
    rows = [line.split(",") for line in (model_dir / "losses_cstorch.csv").read_text().splitlines() if line[0].isdigit()]
    return [(int(s), float(v)) for s, v in rows]


def close(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> bool:
    return [s for s, _ in a] == [s for s, _ in b] and all(abs(x - y) <= 1e-6 for (_, x), (_, y) in zip(a, b))


def fc_model() -> Any:
    import model  # models/fc_mnist/model.py (on sys.path)
    from csrun.run.params import params_from_dict, read_yaml

    params = params_from_dict(read_yaml(DEBUG_YAML), model_config=model.FcMnistConfig,
                              input_config=model.FcMnistInputConfig)
    return model.FcMnist(params.model)


def test_a_2x_checkpoint_resumes_in_the_runner_and_in_cbtorch(train_cstorch: Callable[..., int],
                                                               fc_mnist: Callable[..., int],  # noqa: F811
                                                               tmp_path: Path) -> None:
    two, runner = tmp_path / "2x", tmp_path / "runner"
    assert train_cstorch("--model_dir", str(two), "--backend", "CSX", "--max_steps", "20",
                         "--checkpoint_steps", "10") == 0
    straight = cstorch_losses(two)
    assert [s for s, _ in straight] == list(range(1, 21))
    assert fc_mnist("--mode", "train", "--params", str(DEBUG_YAML), "-o", str(runner), "--max_steps", "20",
                    "--checkpoint_path", str(two / "checkpoint_10.mdl")) == 0
    assert close(runner_losses(runner), straight[10:])  # the runner continued the 2.x run exactly

    cbtorch.initialize()
    model = cbtorch.module(fc_model())
    cbtorch.optimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    saved = cstorch.load(two / "checkpoint_20.mdl")
    cbtorch.set_state(cbtorch.load(two / "checkpoint_20.mdl"))
    assert cbtorch.global_step() == 20
    state = cbtorch.get_state()
    assert all(torch.equal(state["model"][k], v) for k, v in saved["model"].items())
    assert torch.equal(state["optimizer"]["state"][0]["momentum_buffer"], saved["optimizer"]["state"][0]["momentum_buffer"])


def test_runner_and_cbtorch_checkpoints_resume_in_2x(train_cstorch: Callable[..., int],
                                                     fc_mnist: Callable[..., int],  # noqa: F811
                                                     tmp_path: Path) -> None:
    runner = tmp_path / "runner"
    assert fc_mnist("--mode", "train", "--params", str(DEBUG_YAML), "-o", str(runner), "--max_steps", "20",
                    "--checkpoint_steps", "10") == 0
    straight = runner_losses(runner)
    assert train_cstorch("--model_dir", str(tmp_path / "from_runner"), "--backend", "CSX", "--max_steps", "20",
                         "--checkpoint_path", str(runner / "checkpoint_10.mdl")) == 0
    assert close(cstorch_losses(tmp_path / "from_runner"), straight[10:])

    state_mod.reset_for_tests()
    cbtorch.initialize()  # a cbtorch script's checkpoint: get_state() saved with cbtorch.save
    model = cbtorch.module(fc_model())
    cbtorch.optimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    cbtorch.set_state(cbtorch.load(runner / "checkpoint_10.mdl"))
    cbtorch.save(cbtorch.get_state(), tmp_path / "cbtorch.mdl")
    assert set(cbtorch.load(tmp_path / "cbtorch.mdl")) == {"model", "optimizer", "amp", "global_step"}
    assert train_cstorch("--model_dir", str(tmp_path / "from_cbtorch"), "--max_steps", "20",
                         "--checkpoint_path", str(tmp_path / "cbtorch.mdl")) == 0
    assert close(cstorch_losses(tmp_path / "from_cbtorch"), straight[10:])
