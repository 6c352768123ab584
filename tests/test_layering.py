"""The house's import order: every import in csrun/ goes down the declared floors, never up or sideways.

The floors are the ones ARCHITECTURE.md draws. A room is a top-level module or package of
``csrun`` (``csrun/compiler/...`` is the room ``compiler``). Imports inside functions count
too: a lazy import is still an edge. A room may import itself and any room on a lower floor;
an import of a room on its own floor or above fails the test with the file, line and edge.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "csrun"

FLOORS: tuple[tuple[str, ...], ...] = (
    ("errors",),
    ("typed_config", "address", "help_style", "files", "module_alias", "yaml_file", "consoles"),
    ("env_settings",),
    ("cluster", "site", "program", "data", "mdl", "appliance", "task_exits"),
    ("stream", "compiler", "launch"),
    ("emulator",),
    ("driver",),
    ("torch",),
    ("pytorch", "run"),
    ("cli",),
)
"""From the ground up. ``csrun/__init__.py`` (the package's face) is on no floor."""

FLOOR_OF = {room: level for level, rooms in enumerate(FLOORS) for room in rooms}


def _room(module: str) -> str | None:
    """The room of a dotted module name inside csrun, or None for ``csrun`` itself / outside."""
    parts = module.split(".")
    if parts[0] != "csrun" or len(parts) < 2:
        return None
    return parts[1]


def _module_of(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) for every import statement in the file, nested ones included."""
    here = _module_of(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    return _imports_in(path.read_text(), package)


def _imports_in(source: str, package: str) -> list[tuple[int, str]]:
    """(line, absolute module) for every import in ``source``, a module of ``package``."""
    tree = ast.parse(source)
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.append((node.lineno, target))
            if target == "csrun":
                found.extend((node.lineno, f"csrun.{alias.name}") for alias in node.names)
    return found


def _python_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_room_is_on_a_floor() -> None:
    rooms = {_room(_module_of(p)) for p in _python_files()} - {None}
    missing = sorted(r for r in rooms if r not in FLOOR_OF)
    assert not missing, f"rooms with no floor in FLOORS (add them, and to ARCHITECTURE.md): {missing}"


def test_no_import_runs_up_or_sideways() -> None:
    bad: list[str] = []
    for path in _python_files():
        source_room = _room(_module_of(path))
        if source_room is None:
            continue
        for line, target in _imports(path):
            target_room = _room(target)
            if target_room is None or target_room == source_room:
                continue
            if FLOOR_OF.get(target_room, -1) >= FLOOR_OF[source_room]:
                bad.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {source_room} -> {target_room} ({target})")
    assert not bad, "imports that run up or sideways:\n" + "\n".join(bad)


def test_the_walker_sees_nested_and_relative_imports() -> None:
    """The test above can fail: the walker finds imports hidden in functions and relative ones."""
    source = "import os\ndef f():\n    from csrun.torch import module\n    from ..run import params\n    from . import wire\n"
    edges = {target for _, target in _imports_in(source, "csrun.stream")}
    assert edges == {"os", "csrun.torch", "csrun.run", "csrun.stream"}
    assert {_room(t) for t in edges} == {None, "torch", "run", "stream"}


USER_API_ROOMS = ("torch", "pytorch", "run")
"""The APIs a script uses and the runner: they reach the device through the driver only."""


def test_the_user_apis_never_import_the_emulator() -> None:
    """Training semantics (optimizers, clipping, schedules) live in ``program/``, the device behind
    the driver: ``torch/``, ``pytorch/`` and ``run/`` import nothing of ``emulator/`` (issue 32)."""
    bad = [f"{path.relative_to(PACKAGE.parent)}:{line}: {target}"
           for path in _python_files() if _room(_module_of(path)) in USER_API_ROOMS
           for line, target in _imports(path) if _room(target) == "emulator"]
    assert not bad, "user-API rooms importing the emulator:\n" + "\n".join(bad)
