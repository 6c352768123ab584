"""ARCHITECTURE.md's path of one batch names real functions, at most 8 hops, no module twice."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOP = re.compile(r"^\d+\. `([\w/]+)\.([\w.]+)`", re.M)


def _hops() -> list[tuple[str, str]]:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    section = text.split("## One batch", 1)[1].split("\n## ", 1)[0]
    return HOP.findall(section)


def test_the_cluster_step_names_real_functions() -> None:
    text = (ROOT / "ARCHITECTURE.md").read_text()
    section = text.split("## One step on a cluster", 1)[1].split("\n## ", 1)[0]
    names = re.findall(r"`((?:driver|emulator|torch)/[\w/]+)\.([\w.]+)`", section)
    assert len(names) >= 6, names
    for module, attr in names:
        obj = importlib.import_module("csrun." + module.replace("/", "."))
        for part in attr.split("."):
            obj = getattr(obj, part)  # AttributeError names the stale name
        assert callable(obj), (module, attr)


def test_the_batch_path_is_at_most_eight_modules_each_entered_once() -> None:
    hops = _hops()
    modules = [module for module, _ in hops]
    assert 1 < len(hops) <= 8, hops
    assert len(set(modules)) == len(modules), f"a module entered twice: {modules}"


def test_every_hop_names_a_function_that_exists() -> None:
    for module, attr in _hops():
        obj = importlib.import_module("csrun." + module.replace("/", "."))
        for part in attr.split("."):
            obj = getattr(obj, part)  # AttributeError names the stale hop
        assert callable(obj), (module, attr)
