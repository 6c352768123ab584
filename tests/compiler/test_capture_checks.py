"""Graph checks: each value read / data-dependent branch in forward is reported at its line."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from csrun.compiler import CompileFailed, validate_only
from csrun.compiler.errors import CaptureFailed, DataDependentControlFlow, TensorToScalar, UnsupportedOutput

from .helpers import SETTINGS, line_of, same_file


class Offender(nn.Module):
    """One model, one offending line per ``kind``."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.lin = nn.Linear(4, 2)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        loss = F.mse_loss(self.lin(batch["x"]), batch["y"])
        if self.kind == "if":
            if loss > 0:  # MARK-if
                loss = loss * 2
        elif self.kind == "while":
            while loss < 10:  # MARK-while
                loss = loss * 2
        elif self.kind == "for":
            for _ in range(int(batch["n"].sum())):  # MARK-for
                loss = loss + 1
        elif self.kind == "item":
            self.last = loss.item()  # MARK-item
        elif self.kind == "float":
            self.last = float(loss)  # MARK-float
        elif self.kind == "print":
            print("loss", loss)  # MARK-print
        elif self.kind == "assert":
            assert loss >= 0  # MARK-assert
        elif self.kind == "tolist":
            self.last = batch["x"].tolist()  # MARK-tolist
        elif self.kind == "numpy":
            self.last = loss.detach().cpu().numpy()  # MARK-numpy
        return loss


def _batch() -> dict[str, torch.Tensor]:
    return {"x": torch.randn(3, 4), "y": torch.randn(3, 2), "n": torch.tensor([1, 2])}


CASES = [("if", DataDependentControlFlow), ("while", DataDependentControlFlow), ("for", DataDependentControlFlow),
         ("item", TensorToScalar), ("float", TensorToScalar), ("print", TensorToScalar), ("assert", TensorToScalar),
         ("tolist", TensorToScalar), ("numpy", TensorToScalar)]


@pytest.mark.parametrize("kind,cls", CASES, ids=[c[0] for c in CASES])
def test_value_reads_are_located(kind: str, cls: type, capsys: pytest.CaptureFixture[str]) -> None:
    result = validate_only(Offender(kind), _batch(), settings=SETTINGS)
    assert not result.ok
    assert len(result.problems) == 1, [p.render() for p in result.problems]
    problem = result.problems[0]
    assert type(problem) is cls
    assert same_file(problem.filename, __file__)
    assert problem.lineno == line_of(Offender.forward, f"# MARK-{kind}")
    assert f"MARK-{kind}" in problem.location.source_line
    text = problem.render()
    if cls is DataDependentControlFlow:
        assert "torch.where" in text
    else:
        assert "step closure" in text
    assert problem.exit_code == 1


class ManyProblems(nn.Module):
    """Three reads of a value in one forward, each on a marked line the checks must report."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        loss = F.mse_loss(self.lin(batch["x"]), batch["y"])
        if loss.sum() > 1:  # MANY-1
            loss = loss + 1
        print(loss)  # MANY-2
        scale = loss.item()  # MANY-3
        return loss * scale


def test_all_value_reads_reported_in_one_pass() -> None:
    result = validate_only(ManyProblems(), _batch(), settings=SETTINGS)
    lines = [p.lineno for p in result.problems]
    assert lines == [line_of(ManyProblems.forward, f"# MANY-{i}") for i in (1, 2, 3)]
    with pytest.raises(CompileFailed) as info:
        result.raise_for_problems()
    assert len(info.value.problems) == 3
    assert "3 problems" in str(info.value) and "# MANY-2" in str(info.value)


class NoLoss(nn.Module):
    """A forward that returns no loss: the check must name its ``def forward`` line."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"logits": self.lin(batch["x"])}


def test_forward_must_return_loss() -> None:
    result = validate_only(NoLoss(), _batch(), settings=SETTINGS)
    assert [type(p) for p in result.problems] == [UnsupportedOutput]
    assert same_file(result.problems[0].filename, __file__)
    assert result.problems[0].lineno == line_of(NoLoss.forward, "def forward")
    assert "'loss'" in result.problems[0].render()


class Clean(nn.Module):
    """A static shape branch and a ``torch.where``: what the checks must let through."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        loss = F.mse_loss(self.lin(batch["x"]), batch["y"])
        if batch["x"].shape[0] > 1:  # static: shapes are known, fine
            loss = torch.where(loss > 0, loss * 2, loss)
        return loss


def test_static_shape_branch_and_where_are_fine() -> None:
    result = validate_only(Clean(), _batch(), settings=SETTINGS)
    assert result.ok, [p.render() for p in result.problems]
    assert [(i.path, i.dtype, i.shape) for i in result.spec.inputs] == [
        ("['x']", "float32", (3, 4)), ("['y']", "float32", (3, 2)), ("['n']", "int64", (2,))]


class MissingKey(nn.Module):
    """Reads a batch key the batch lacks, on a marked line the capture's error must name."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 2)

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return F.mse_loss(self.lin(batch["x"]), batch["labels"])  # MISSING


def test_other_errors_in_the_step_are_located() -> None:
    result = validate_only(MissingKey(), _batch(), settings=SETTINGS)
    [p] = result.problems
    assert type(p) is CaptureFailed and p.lineno == line_of(MissingKey.forward, "# MISSING")
    assert "KeyError" in p.render() and "csrun_cpu" in p.render()


def test_eval_program_has_no_optimizer(tmp_path) -> None:  # noqa: ANN001
    from csrun.compiler import CompileSettings, compile_only

    from .helpers import console

    con, buf = console()
    r = compile_only(Clean(), _batch(), settings=CompileSettings(mode="eval"), model_dir=str(tmp_path), console=con)
    assert r.ok and r.spec.mode == "eval" and r.spec.optimizer is None
    assert all(l.samples_in_flight == 1 and l.optimizer_state_bytes == 0 for l in r.plan.layers)
    assert "Compile for evaluation completed successfully!" in buf.getvalue()
