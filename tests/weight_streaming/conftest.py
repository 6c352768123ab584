"""Fixtures for the weight-streaming tests: GPT (models/gpt2) run in-process, one torch thread."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import yaml

from tests.conftest import REPO
from tests.run.conftest import _one_thread  # noqa: F401 - the autouse fixture: one torch thread

GPT = REPO / "models" / "gpt2"
GPT3_DEBUG = REPO / "configs" / "gpt3_debug.yaml"
GPT3_XL = REPO / "configs" / "gpt3_xl.yaml"


@pytest.fixture()
def gpt(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., int]]:
    """``gpt(*argv) -> exit status``: models/gpt2/run.py's run() (or its --shapes_only compile) in this process."""
    for name in ("CS_IP", "CSRUN_LAUNCHER", "CSRUN_EXECUTION_STRATEGY"):
        monkeypatch.delenv(name, raising=False)
    for name in ("model", "data", "shapes_only"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(GPT))  # run.py is a script: its siblings import by name
    import data
    import model
    import shapes_only

    from csrun.run import run
    from csrun.torch import process_state as torch_state

    def call(*argv: str) -> int:
        if shapes_only.wanted(list(argv)):
            return shapes_only.compile_shapes_only(list(argv), model_fn=model.gpt2_model, model_config=model.Gpt2Config,
                                                   input_config=data.GptInputConfig)
        torch_state.reset_for_tests()
        try:
            return run(model_fn=model.gpt2_model, train_input_fn=data.train_input_dataloader,
                       eval_input_fn=data.eval_input_dataloader, model_config=model.Gpt2Config,
                       input_config=data.GptInputConfig, eval_metrics=model.gpt2_eval_metrics,
                       extra_args_parser_fn=shapes_only.extra_args, argv=list(argv))
        finally:
            torch_state.reset_for_tests()

    yield call
    for name in ("model", "data", "shapes_only"):
        sys.modules.pop(name, None)


def debug_yaml(path: Path, *, model: dict[str, Any] | None = None, optimizer: dict[str, Any] | None = None,
               **runconfig: Any) -> Path:
    """A copy of gpt3_debug.yaml with keys of ``model``, ``optimizer`` and ``runconfig`` replaced."""
    data = yaml.safe_load(GPT3_DEBUG.read_text())
    data["model"].update(model or {})
    data["optimizer"].update(optimizer or {})
    data["runconfig"].update(runconfig)
    path.write_text(yaml.safe_dump(data))
    return path
