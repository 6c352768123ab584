"""Graph clean-ups of the engine: a .float() in the forward must not stop the program from running
under autocast; a graph captured on the CPU runs on another device (tensors it creates are made
there, a view recorded on the capture's strides does not fail on another layout)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from csrun.compiler.spec import OptimizerSpec, ProgramSpec
from csrun.emulator.engine.executor import Engine, drop_metadata_asserts, retarget_graph


class CastsLogits(nn.Module):
    """A forward that casts its logits to float32 (a cast under float16 autocast): shaped for the test below."""

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
    from csrun.program.errors import SpecError

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


class FlattensAfterTranspose(nn.Module):
    """Heads merged back as attention code does: transpose, then view (legal on the capture's strides)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        heads = x.transpose(1, 2)  # (b, h, s, d) -> (b, s, h, d): not contiguous
        return heads.contiguous().view(x.shape[0], x.shape[2], -1).sum(-1)


def test_relaxed_views_accept_strides_the_capture_did_not_see() -> None:
    x = torch.randn(2, 3, 4, 5)
    module = torch.export.export(FlattensAfterTranspose(), (x,)).module()
    # another device's kernels hand the view a tensor laid out differently: emulate that by
    # taking the .contiguous() out, so the view meets a transposed layout
    for node in list(module.graph.nodes):
        if node.op == "call_function" and node.target is torch.ops.aten.contiguous.default:
            node.replace_all_uses_with(node.args[0])
            module.graph.erase_node(node)
    module.recompile()
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        module(x)
    assert retarget_graph(module, torch.device("cpu")) >= 1
    assert not any(n.target is torch.ops.aten.view.default for n in module.graph.nodes)
    assert torch.equal(module(x), FlattensAfterTranspose()(x))
    assert retarget_graph(module, torch.device("cpu")) == 0  # nothing left to change


class MakesPositions(nn.Module):
    """BERT's position ids: a tensor the forward creates on its input's device."""

    def __init__(self) -> None:
        super().__init__()
        self.pos = nn.Embedding(16, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.pos(positions).sum() + torch.zeros(2, device=ids.device).sum() + ids.to(ids.device).sum()


def test_tensors_the_graph_creates_are_made_on_the_engines_device() -> None:
    ids = torch.randint(0, 16, (2, 8))
    module = torch.export.export(MakesPositions(), (ids,)).module()
    before = [n for n in module.graph.nodes if n.op == "call_function" and "device" in n.kwargs]
    assert before and all(torch.device(n.kwargs["device"]).type == "cpu" for n in before)
    target = torch.device("cuda", 1)  # only the graph is rewritten: no GPU needed
    assert retarget_graph(module, target) >= len(before)
    made = [n for n in module.graph.nodes if n.op == "call_function" and "device" in n.kwargs]
    assert made and all(n.kwargs["device"] == target for n in made)
    assert not any(n.target is torch.ops.aten.to.device and torch.device(n.args[1]).type == "cpu"
                   for n in module.graph.nodes)
    assert "cuda" in module.code
