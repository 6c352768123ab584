"""A compile's outcome and the reading of a compile directory.

:class:`CompileResult` is what :func:`~csrun.compiler.flow.validate_only` and
:func:`~csrun.compiler.flow.compile_only` return (the report, :mod:`csrun.compiler.report`,
prints it); :func:`load_program` reads a complete ``cs_<hash>/`` back (checksums verified, the
archive read as data); :func:`exit_code` is the legacy exit code of a result. The files of a
compile directory: :data:`SPEC_FILE`, :data:`PLAN_FILE`, :data:`ESTIMATE_FILE`,
:data:`REPORT_FILE`, the program (``program.pt2``) and the ``COMPLETE`` marker.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

import torch

from csrun.compiler.cache.compile_dir import MARKER, verify_checksums
from csrun.compiler.cache.program_io import PROGRAM_FILE, bind_weights, load_exported_program
from csrun.compiler.errors import Problem, UnsafeProgram, raise_all
from csrun.compiler.placement import Plan
from csrun.compiler.spec import ProgramSpec

SPEC_FILE = "spec.json"
PLAN_FILE = "plan.json"
ESTIMATE_FILE = "estimate.json"
REPORT_FILE = "report.txt"


@dataclass(kw_only=True)
class CompileResult:
    """The outcome of :func:`validate_only` or :func:`compile_only`."""

    ok: bool
    """No problems: the step was captured (and, for a compile, fits the wafer)."""
    validate_only: bool = False
    problems: list[Problem] = field(default_factory=list)
    """Every problem found, in one pass."""
    spec: ProgramSpec | None = None
    plan: Plan | None = None
    """The placement (None for validate_only and failures before placement; rebuilt from
    ``plan.json`` on a cache hit by source key)."""
    plan_json: dict[str, Any] | None = None
    estimate_json: dict[str, Any] | None = None
    directory: str | None = None
    """The compile directory (``cs_<hash>/`` or the explicit compile_dir)."""
    cache_hit: bool = False
    """An existing complete directory was reused."""
    program: torch.export.ExportedProgram | None = None
    """The captured program (None on a fast cache hit: see :meth:`exported_program`)."""
    seconds: float = 0.0
    capture_seconds: float = 0.0

    def raise_for_problems(self) -> None:
        """Raise the problem (one) or :class:`~csrun.compiler.errors.CompileFailed` (several)."""
        raise_all(self.problems)

    def exported_program(self) -> torch.export.ExportedProgram:
        """The program: the captured one (with the model's weights), or read as data
        (:mod:`csrun.program.archive`) from the compile directory, whose weights are shape-only placeholders:
        give them values with :func:`csrun.compiler.cache.program_io.bind_weights`."""
        if self.program is None:
            if not self.directory:
                self.raise_for_problems()
                raise RuntimeError("no program: nothing was compiled")
            self.program, _ = load_program(self.directory)
        return self.program


def exit_code(result: CompileResult) -> int:
    """0 for success, 1 for a failed validation/compile (the legacy exit codes)."""
    return 0 if result.ok else 1


def load_program(directory: str, *, weights: Mapping[str, torch.Tensor] | None = None
                 ) -> tuple[torch.export.ExportedProgram, ProgramSpec]:
    """The program and spec of a complete compile directory.

    The saved program's weights are shape-only placeholders (the compile key covers weight
    shapes, not values); pass ``weights`` (``model.state_dict()`` or a checkpoint's) to bind
    them (:func:`~csrun.compiler.cache.program_io.bind_weights`).

    Refuses (:class:`UnsafeProgram`) a directory without a valid ``COMPLETE`` marker, with a
    file whose checksum differs from the marker's, or whose archive is not plain data
    (:mod:`csrun.program.archive`).
    """
    try:
        with open(os.path.join(directory, MARKER)) as f:
            marker = json.load(f)
        marker["files"].items()
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise UnsafeProgram(f"{directory} is not a complete compile directory (no valid {MARKER} marker)") from None
    bad = verify_checksums(directory, marker)
    if bad:
        raise UnsafeProgram(f"{directory}: {', '.join(bad)} changed after the compile (checksum mismatch)")
    with open(os.path.join(directory, SPEC_FILE)) as f:
        spec = ProgramSpec.from_json(f.read())
    program = load_exported_program(os.path.join(directory, PROGRAM_FILE))
    if weights is not None:
        bind_weights(program, weights)
    return program, spec
