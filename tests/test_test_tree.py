"""The test tree's own rule: no module under tests/ imports a test module (issue 32, item 6).

A test module (``test_*.py``) is pytest's to import, once, as a test. What several tests share
lives in a helper module (``helpers.py``, ``tiny_models.py``, ...) or a ``conftest.py``: a test
module importing another runs, or re-collects, that module's tests and its fixtures with it, and
ties the two files' edits together. Imports inside functions count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def _is_test_module(dotted: str) -> bool:
    """A module whose last dotted part starts with ``test_``."""
    return dotted.rpartition(".")[2].startswith("test_")


def imports_of_test_modules(source: str, package: str, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, module) for each import in ``source`` (a module of ``package``) of a test module.

    ``from p import name`` counts when ``p.name`` is a test module file under ``root``.
    """
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, a.name) for a in node.names if _is_test_module(a.name))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if _is_test_module(target):
                found.append((node.lineno, target))
                continue
            for a in node.names:
                sub = f"{target}.{a.name}" if target else a.name
                if _is_test_module(sub) and (root / Path(*sub.split("."))).with_suffix(".py").is_file():
                    found.append((node.lineno, sub))
    return found


def _package_of(path: Path) -> str:
    return ".".join(path.parent.relative_to(ROOT).parts)


def test_no_module_under_tests_imports_a_test_module() -> None:
    files = sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)
    assert any(p.name.startswith("test_") for p in files) and TESTS / "tiny_models.py" in files
    bad = [f"{p.relative_to(ROOT)}:{line}: imports the test module {module}"
           for p in files for line, module in imports_of_test_modules(p.read_text(), _package_of(p))]
    assert not bad, "\n".join(["a test module is pytest's; move what is shared to a helper module or a conftest.py:", *bad])


def test_the_check_sees_every_form_of_import(tmp_path: Path) -> None:
    (tmp_path / "tests" / "run").mkdir(parents=True)
    (tmp_path / "tests" / "run" / "test_train.py").write_text("")
    source = "\n".join([
        "import tests.run.test_train",                        # 1
        "import tests.run.test_train as t",                   # 2
        "from tests.run.test_train import scalars",           # 3
        "from .test_train import scalars",                    # 4
        "from . import test_train",                           # 5
        "from tests.run import test_train",                   # 6
        "def f():",
        "    from ..run.test_train import x",                 # 8
        "from tests.run.conftest import DEBUG_YAML",          # 9: a conftest
        "from .helpers import test_data",                     # 10: a name, not a module file
        "from tests.tiny_models import MLP",                  # 11
        "import pytest",                                      # 12
    ])
    found = imports_of_test_modules(source, "tests.run", tmp_path)
    assert [line for line, _ in found] == [1, 2, 3, 4, 5, 6, 8]
    assert {module for _, module in found} == {"tests.run.test_train"}
