"""A .float() in the forward must not stop the program from running under autocast."""

from __future__ import annotations

import torch
from torch import nn

from csrun.compiler.spec import OptimizerSpec, ProgramSpec
from csrun.emulator.engine import Engine, drop_metadata_asserts


class CastsLogits(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> dict[str, torch.Tensor]:
        x, y = batch
        logits = self.fc(x).float()
        return {"loss": nn.functional.cross_entropy(logits, y)}


def test_casts_in_forward_run_under_float16_autocast() -> None:
    torch.manual_seed(0)
    batch = (torch.randn(16, 8), torch.randint(0, 4, (16,)))
    program = torch.export.export(CastsLogits(), (batch,))
    has_assert = any(n.target is torch.ops.aten._assert_tensor_metadata.default for n in program.graph.nodes)
    spec = ProgramSpec(optimizer=OptimizerSpec(type="sgd"), learning_rate=0.1, precision="float16")
    engine = Engine(program, spec, "cpu")
    loss = engine.run_step(batch)["loss"]
    assert torch.isfinite(loss).all()
    module = program.module()
    assert drop_metadata_asserts(module) == (1 if has_assert else 0) or not has_assert
    assert not any(n.target is torch.ops.aten._assert_tensor_metadata.default for n in module.graph.nodes)


def test_the_engine_checks_inputs_itself_instead_of_the_programs_guards() -> None:
    import pytest

    from csrun.emulator.errors import SpecError

    from .helpers import input_specs

    torch.manual_seed(0)
    batch = (torch.randn(16, 8), torch.randint(0, 4, (16,)))
    program = torch.export.export(CastsLogits(), (batch,))
    spec = ProgramSpec(optimizer=OptimizerSpec(type="sgd"), learning_rate=0.1, precision="float32",
                       inputs=input_specs(batch))
    engine = Engine(program, spec, "cpu")
    assert "_guards_fn" in program.module().code and "_guards_fn" not in engine.module.code
    assert torch.isfinite(engine.run_step(batch)["loss"])
    with pytest.raises(SpecError, match=r"shape \(8, 8\)"):
        engine.run_step((batch[0][:8], batch[1][:8]))
    with pytest.raises(SpecError, match="structure"):
        engine.run_step({"x": batch[0], "y": batch[1]})
    with pytest.raises(SpecError, match="structure"):
        engine.run_step((batch[0], batch[1], batch[1]))
    assert torch.isfinite(engine.run_step(batch)["loss"])
