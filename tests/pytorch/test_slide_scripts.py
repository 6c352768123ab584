"""The slides' two 2.x scripts (seed 001), changed only in the import line and completed with a
small model: on the "CPU" backend, the embedded "CSX", a cs_emulator at cs_ip; float32 losses
equal eager torch's; checkpoint_closure writes at exactly the checkpoint steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import csrun.pytorch as cstorch
from tests.pytorch.conftest import (
    SLIDE_SKELETON,
    SLIDE_TRAIN,
    TOKEN,
    eager_skeleton,
    eager_slide_train,
    python,
    read_losses,
)

pytestmark = pytest.mark.timeout(120)


def test_the_import_line_is_the_only_change() -> None:
    """Each script names the API as the slide does; its import line is csrun.pytorch's."""
    for script, alias in ((SLIDE_TRAIN, "cstorch"), (SLIDE_SKELETON, "cstorchtch")):
        text = script.read_text()
        assert f"import csrun.pytorch as {alias}" in text and "cerebras" not in text.split("import torch")[1]
        assert text.count("import csrun.pytorch") == 1


@pytest.mark.parametrize("backend", ["CPU", "CSX"])
def test_slide_train_equals_eager_torch(backend: str, tmp_path: Path) -> None:
    done = python(SLIDE_TRAIN, backend, str(tmp_path / "losses.txt"), cwd=tmp_path)
    losses = read_losses(tmp_path / "losses.txt")
    eager = eager_slide_train()
    assert len(losses) == len(eager) == 30
    assert max(abs(a - b) for a, b in zip(losses, eager)) <= 1e-6
    assert done.stdout.count("Loss: ") == 30
    compiled = "Compile for training completed successfully!" in done.stdout
    assert compiled == (backend == "CSX")  # CSX compiled the step and ran it on the emulator
    assert list(tmp_path.glob("model_dir/cs_*")) if backend == "CSX" else not (tmp_path / "model_dir").exists()


def test_slide_train_on_a_cs_emulator(emulator: str, tmp_path: Path) -> None:
    done = python(SLIDE_TRAIN, "CSX", str(tmp_path / "losses.txt"), emulator, cwd=tmp_path,
                  CSRUN_EMULATOR_TOKEN=TOKEN)
    assert "Compile for training completed successfully!" in done.stdout
    assert max(abs(a - b) for a, b in zip(read_losses(tmp_path / "losses.txt"), eager_slide_train())) <= 1e-6


def test_skeleton_cpu_csx_and_cs_emulator_equal_eager_and_checkpoint_on_schedule(emulator: str, tmp_path: Path) -> None:
    """1000 steps (the slide's num_steps) with checkpoint_steps=100: the skeleton's save_checkpoint(i)
    runs at steps 100, 200, ..., 1000 (i = 99, ..., 999), holding the state after that step."""
    eager, weights_100 = eager_skeleton(100)
    runs = {"CPU": (), "CSX": (), "cs_ip": ("-", emulator)}
    for name, extra in runs.items():
        out = tmp_path / name
        backend = "CPU" if name == "CPU" else "CSX"
        python(SLIDE_SKELETON, backend, str(out), "0", *extra, cwd=tmp_path, CSRUN_EMULATOR_TOKEN=TOKEN)
        losses = read_losses(out / "losses.txt")
        assert len(losses) == 1000
        assert max(abs(a - b) for a, b in zip(losses[:100], eager)) <= 1e-6, name
        assert sorted(p.name for p in out.glob("*.mdl")) == sorted(f"checkpoint_{i}.mdl" for i in range(99, 1000, 100))
        first = cstorch.load(out / "checkpoint_99.mdl")
        assert first["global_step"] == 99 and first["lr_scheduler"] == {"global_step": 100}
        for key, value in weights_100.items():
            assert torch.allclose(first["model"][key], value, atol=1e-6, rtol=0), (name, key)
        assert "momentum_buffer" in str(first["optimizer"]["state"])  # the device's optimizer state, as torch names it
