"""A fuzzer of the inputs a user gives csrun: the params files, run.py's and the launchers' flags,
the ``CSRUN_*`` variables, and hostile HDF5 data; it counts tracebacks and accepted nonsense.

Command (from the repository root; ``--count 0`` runs every mutation, ``--kinds`` a subset)::

    .venv/bin/python -m tests.run.input_fuzz --count 400 --seed 1 --jobs 2

Mutations (:func:`all_mutations`):

* **params**: every leaf of the shipped params files (``configs/fc_mnist*.yaml``,
  ``gpt2_small``/``gpt2_debug``, ``bert_base_msl128``/``bert_debug``; inside the learning-rate
  schedules too) set to each of :data:`ODD_VALUES` (0, -7, inf, nan, 1e100, -1e308, huge
  integers, wrong types, empty and long strings). A full-size file runs ``run.py --validate_only``;
  a debug twin trains 2 steps on the CPU, so the data pipeline reads the values too.
* **flags**: each option of ``csrun_wse`` and ``csrun_cpu`` (with ``--dry-run``; ``--use-sbatch
  --dry-run`` for the batch options) and each of run.py's value flags (with ``--validate_only``)
  given each of :data:`ODD_WORDS`; ``--cs_ip`` junk.
* **env**: each ``CSRUN_*`` knob and site variable given each odd word, under ``csrun_wse
  --dry-run`` (which reads them all), ``python-pt`` and ``python-ws``.
* **data**: the GPT-2 and BERT debug data with one value of one row out of its range (ids >= the
  vocabulary, labels of -7, positions past the sequence, a NaN weight), trained on the CPU
  (``--cpu``) and on the embedded emulator (``--cs_ip embedded``).

Each mutation runs in a forked child of this process (torch and csrun imported once), with its
output in a file, an address-space limit (:data:`MEMORY_LIMIT`) and a time limit: at the limit it
gets SIGTERM, and SIGKILL 5 s later. A result is a **traceback** (``Traceback`` in the output, or
an exit other than 0, 1 or 2), a **hang** (killed at the time limit; ``ignored SIGTERM`` when
SIGTERM did not end it), **nonsense accepted** (exit 0 for a value :func:`is_nonsense` says no
setting may take: negative, infinite, NaN, beyond float32's range, an integer beyond 64 bits, an
empty or mistyped value given to an option), or a **many-line error** (exit 2 whose output has more
than one ``error`` line). Everything else passes. Each failing one is printed as it ends; the
report ends with the counts.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import random
import resource
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Iterator

import yaml

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
MODELS = {"fc_mnist": ["fc_mnist.yaml", "fc_mnist_debug.yaml"], "gpt2": ["gpt2_small.yaml", "gpt2_debug.yaml"],
          "bert": ["bert_base_msl128.yaml", "bert_debug.yaml"]}
"""Each model and its shipped params files (a full one, its debug twin)."""
MEMORY_LIMIT = 12 << 30
"""Address space a mutation's process may take (torch's own mappings take a few GB)."""
TIME_LIMIT_S = 180.0
"""Seconds a mutation may run before it is stopped and counted a hang."""

HUGE_INTS: list[Any] = [2**63, 10**20, 2**100]
ODD_VALUES: list[Any] = [0, -7, float("inf"), float("-inf"), float("nan"), 1e100, -1e308, *HUGE_INTS, "ten", "",
                         "x" * 5000, True, [], {}, None]
"""What a params leaf is set to."""
ODD_NUMBERS = ["0", "-7", "inf", "nan", "1e100", "-1e308", str(2**63), str(10**20), "1.5", "ten", "", "x" * 5000]
"""What a numeric flag or variable is given."""
ODD_WORDS = ODD_NUMBERS + ["maybe", "..", "a b", "0:00", "-1:00"]
"""What any flag or variable is given."""


@dataclasses.dataclass(frozen=True)
class Mutation:
    """One run: a label, the program (``run.py`` of a model, or a command), its argv, environment and files."""

    kind: str
    label: str
    program: str
    """``model:<name>`` (that model's run.py), or a console command (``csrun_wse``, ``python-pt`` ...)."""
    argv: tuple[str, ...]
    nonsense: bool
    """Exit 0 would be accepted nonsense."""
    params: tuple[str, tuple[tuple[tuple[Any, ...], Any], ...]] | None = None
    """``(file in configs/, ((path, value), ...))``: that params file with those leaves set, written to
    ``params.yaml`` (``{params}`` in argv)."""
    env: tuple[tuple[str, str], ...] = ()
    data: tuple[str, str, int, int | float] | None = None
    """``(model, field, row, value)``: a copy of the model's debug data with that value (``{data}`` in the params)."""


def _leaves(node: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(node, list) and node and all(isinstance(v, dict) for v in node):
        for i, value in enumerate(node):
            yield from _leaves(value, (*path, i))
    else:
        yield path, node


def _set(data: Any, path: tuple[Any, ...], value: Any) -> None:
    for key in path[:-1]:
        data = data[key]
    data[path[-1]] = value


def is_number(value: Any) -> bool:
    """An int or float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_nonsense(original: Any, value: Any) -> bool:
    """No setting whose shipped value is ``original`` may take ``value``: a negative, infinite or NaN
    number, one beyond float32's range, an integer beyond 64 bits (or a float where a whole number
    belongs and the reverse are not counted: 1e100 as an int is), or a wrong type for a number."""
    if not is_number(original):
        return False
    if not is_number(value):
        return isinstance(value, (str, list, dict)) or value is True
    if math.isnan(value) or math.isinf(value) or value < 0 or abs(value) > 3.4e38:
        return True
    return isinstance(original, int) and abs(value) >= 2**63


def params_mutations() -> list[Mutation]:
    """Every leaf of every shipped params file set to each odd value."""
    out = []
    for model, files in MODELS.items():
        for name in files:
            base = yaml.safe_load((CONFIGS / name).read_text())
            debug = "debug" in name
            fixed = (((("runconfig", "max_steps"), 2), (("runconfig", "log_steps"), 1)) if debug else ())
            for path, original in _leaves(base):
                for value in ODD_VALUES:
                    argv = ("-p", "{params}", "-m", "train", "-o", "{model_dir}",
                            *(("--cpu",) if debug else ("--validate_only",)))
                    shown = repr(value) if not isinstance(value, str) or len(value) < 20 else f"'x'*{len(value)}"
                    out.append(Mutation("params", f"{name} {'.'.join(map(str, path))} = {shown}", f"model:{model}",
                                        argv, is_nonsense(original, value), params=(name, (*fixed, (path, value)))))
    return out


WSE_INT_OPTIONS = {"--total-nodes": 1, "--tasks-per-node": 1, "--cpus-per-task": 1, "--single-task-nodes": 0,
                   "--preempt-lead": 0, "--num-csx": 1}
"""csrun_wse's whole-number options and their least value."""
VALUE_OPTIONS = ["--time", "--job-name", "--log-dir", "--mount-dirs", "--logging"]
"""Options of both launchers that take a value (any non-empty word may be right for some)."""
BOOL_OPTIONS = {"csrun_cpu": ["--alloc-node", "--exclude-gres"], "csrun_wse": []}
RUN_INT_FLAGS = {"--max_steps": 1, "--eval_steps": 1, "--checkpoint_steps": 0, "--verify_steps": 0, "--verify_every": 0, "--num_csx": 1}
RUN_WORD_FLAGS = ["--cs_ip", "--logging", "--model_dir", "--compile_dir", "--checkpoint_path", "--config",
                  "--execution_strategy", "--mode"]
CS_IP_JUNK = ["::::", "host:99999", "host:-1", "host:0", "a b:9000", "http://host:9000", "[::1", "1.2.3.4:9000:1",
              "x" * 300 + ":9000", "host:9000/path", ""]


def _time_nonsense(word: str) -> bool:
    import re

    good = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", word)
    return not good or not any(d in "123456789" for d in word) or len(word) > 12


def _word_nonsense(option: str, word: str, least: int | None) -> bool:
    """A launcher or run.py option given ``word`` must refuse it."""
    if least is not None:
        return not (word.isdigit() and least <= int(word) < 2**31)
    if word == "":
        return True
    if option == "--time":
        return _time_nonsense(word)
    if option in ("--logging", "--alloc-node", "--exclude-gres"):
        return word.lower() not in ("true", "false", "yes", "no", "1", "0", "on", "off")
    return False


def flag_mutations() -> list[Mutation]:
    """Each launcher option and run.py flag given each odd word."""
    out = []
    command = ("python-pt", "run.py", "--mode", "train", "--params", "p.yaml")
    for prog in ("csrun_wse", "csrun_cpu"):
        options = {**(WSE_INT_OPTIONS if prog == "csrun_wse" else {}), **{o: None for o in VALUE_OPTIONS},
                   **{o: None for o in BOOL_OPTIONS[prog]}}
        if prog == "csrun_wse":
            options["--emulator"] = None
        for option, least in options.items():
            for word in ODD_WORDS:
                sbatch = ("--use-sbatch",) if option in ("--time", "--preempt-lead") else ()
                nonsense = _word_nonsense(option, word, least)
                if option == "--emulator":
                    nonsense = word not in ("cpu", "cuda")
                out.append(Mutation("flags", f"{prog} {option}={word[:20]!r}", prog,
                                    ("--dry-run", *sbatch, f"{option}={word}", *command), nonsense))
        for flag in ("--dry-run", "--use-sbatch", "--legacy-imports", "--wait"):
            out.append(Mutation("flags", f"{prog} {flag}=maybe", prog, ("--dry-run", f"{flag}=maybe", *command), True))
    text = ("fc_mnist_debug.yaml", ())
    for flag, least in RUN_INT_FLAGS.items():
        for word in ODD_NUMBERS:
            out.append(Mutation("flags", f"run.py {flag} {word[:20]!r}", "model:fc_mnist",
                                ("-p", "{params}", "-m", "train", "-o", "{model_dir}", "--validate_only", f"{flag}={word}"),
                                _word_nonsense(flag, word, least), params=text))
    for flag in RUN_WORD_FLAGS:
        words = CS_IP_JUNK if flag == "--cs_ip" else ODD_WORDS
        for word in words:
            nonsense = flag in ("--cs_ip", "--logging", "--execution_strategy", "--mode", "--config")
            argv = ["-p", "{params}", "-o", "{model_dir}", "--validate_only", f"{flag}={word}"]
            if flag != "--mode":
                argv[2:2] = ["-m", "train"]
            out.append(Mutation("flags", f"run.py {flag} {word[:20]!r}", "model:fc_mnist", tuple(argv),
                                nonsense and word not in ("",) or flag == "--cs_ip", params=text))
    return out


INFINITE_OK = {"CSRUN_STREAM_TIMEOUT", "CSRUN_STREAM_ERROR_GRACE"}
"""Variables that take ``inf`` (a deadline that never comes: any large number means the same)."""
ENV_PROGRAMS = {"csrun_wse": ("--dry-run", "python-pt", "run.py"), "python-pt": ("-c", "pass"),
                "python-ws": ("-c", "pass")}


def _positive(word: str) -> bool:
    try:
        return float(word) > 0
    except ValueError:
        return False


def env_mutations() -> list[Mutation]:
    """Each CSRUN_* knob and site variable given each odd word, under each program that reads it."""
    import typing

    from csrun.env_settings import EnvSettings, env_name
    from csrun.site import SiteConfig

    out = []
    for cls in (EnvSettings, SiteConfig):
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            numeric = hints[f.name] in (int, float)
            for word in ODD_WORDS + ["/nonexistent/" + "y" * 300]:
                nonsense = numeric and word != "" and not (word.replace(".", "", 1).isdigit() and float(word) < 2**31
                                                           and (float(word) > 0 or f.metadata.get("min") == 0))
                nonsense = nonsense and not (env_name(f.name) in INFINITE_OK and _positive(word))
                for prog, argv in ENV_PROGRAMS.items():
                    out.append(Mutation("env", f"{prog} {env_name(f.name)}={word[:20]!r}", prog, argv,
                                        nonsense and prog == "csrun_wse", env=((env_name(f.name), word),)))
    return out


DATA_SPOILS = {"gpt2": [("input_ids", 3, 512), ("input_ids", 0, -1), ("labels", 5, -7), ("labels", 2, 10**6),
                        ("attention_mask", 1, 7)],
               "bert": [("input_ids", 3, 512), ("masked_lm_ids", 4, -7), ("masked_lm_positions", 2, 32),
                        ("next_sentence_label", 6, 2), ("token_type_ids", 1, -3), ("masked_lm_weights", 0, float("nan"))]}
"""``(field, row, value)`` written into a copy of each model's debug data."""


def data_mutations() -> list[Mutation]:
    """The debug data with one value out of its range, trained on the CPU and on the embedded emulator."""
    out = []
    for model, spoils in DATA_SPOILS.items():
        edits: list[tuple[tuple[Any, ...], Any]] = [(("runconfig", "max_steps"), 3), (("runconfig", "log_steps"), 1)]
        for section in ("train_input", "eval_input"):
            edits += [((section, "data_dir"), "{data}"), ((section, "shuffle"), False)]
        text = (f"{model}_debug.yaml", tuple(edits))
        for field, row, value in spoils:
            for path in (("--cpu",), ("--cs_ip", "embedded")):
                out.append(Mutation("data", f"{model} {field}[{row}] = {value} {' '.join(path)}", f"model:{model}",
                                    ("-p", "{params}", "-m", "train", "-o", "{model_dir}", *path), True,
                                    params=text, data=(model, field, row, value)))
    return out


KINDS = {"params": params_mutations, "flags": flag_mutations, "env": env_mutations, "data": data_mutations}


def all_mutations(kinds: list[str], count: int, seed: int) -> list[Mutation]:
    """``count`` mutations (0: all) drawn evenly from ``kinds``, in a seeded order."""
    rng = random.Random(seed)
    pools = {kind: KINDS[kind]() for kind in kinds}
    for pool in pools.values():
        rng.shuffle(pool)
    if not count:
        return [m for pool in pools.values() for m in pool]
    picked: list[Mutation] = []
    while len(picked) < count and any(pools.values()):
        for pool in pools.values():
            if pool and len(picked) < count:
                picked.append(pool.pop())
    return picked


def params_text(name: str, edits: tuple[tuple[tuple[Any, ...], Any], ...], data_dir: str = "") -> str:
    """The params file ``configs/<name>`` with ``edits`` made (``"{data}"`` values become ``data_dir``)."""
    data = yaml.safe_load((CONFIGS / name).read_text())
    for path, value in edits:
        _set(data, path, data_dir if value == "{data}" else value)
    return yaml.safe_dump(data, allow_unicode=True)


def spoil_data(model: str, field: str, row: int, value: Any, target: Path) -> Path:
    """A copy of ``model``'s debug data whose ``field`` holds ``value`` in ``row`` (of the first shard)."""
    import h5py

    source = REPO / "models" / model / "data" / "debug_hdf5"
    shutil.copytree(source, target)
    shard = sorted(target.glob("shard_*.h5"))[0]
    with h5py.File(shard, "a") as h5:
        data = h5[field][...]
        data[(row, *([0] * (data.ndim - 1)))] = value
        h5[field][...] = data
    return target


@dataclasses.dataclass
class Outcome:
    """How one mutation ended."""

    mutation: Mutation
    code: int | None
    output: str
    seconds: float
    ignored_term: bool = False

    @property
    def verdict(self) -> str:
        """``ok``, ``traceback``, ``hang``, ``nonsense`` or ``many-lines``."""
        if self.code is None:
            return "hang"
        if "Traceback (most recent call last)" in self.output or self.code not in (0, 1, 2):
            return "traceback"
        if self.code == 0 and self.mutation.nonsense:
            return "nonsense"
        if self.code == 2 and len([ln for ln in self.output.splitlines() if "error" in ln]) > 1:
            return "many-lines"
        return "ok"


def _child(m: Mutation, work: Path) -> None:
    """The forked child: run the mutation with its output in ``work/out`` (never returns)."""
    code = 1
    try:
        fd = os.open(work / "out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.setpgid(0, 0)
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
        os.chdir(work)
        os.environ.update(dict(m.env))
        data = str(spoil_data(*m.data, target=work / "data")) if m.data else ""
        if m.params:
            (work / "params.yaml").write_text(params_text(*m.params, data_dir=data))
        argv = [a.format(params=work / "params.yaml", model_dir=work / "model_dir") for a in m.argv]
        if m.program.startswith("model:"):
            import runpy

            folder = REPO / "models" / m.program.split(":", 1)[1]
            sys.path.insert(0, str(folder))
            sys.argv = [str(folder / "run.py"), *argv]
            runpy.run_path(str(folder / "run.py"), run_name="__main__")
            code = 0
        else:
            from importlib import import_module

            module = import_module("csrun.cli." + m.program.replace("-", "_"))
            sys.argv = [m.program, *argv]
            module.console_main()
            code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:  # what the interpreter would print for an uncaught exception
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def run_one(m: Mutation, root: Path, index: int) -> tuple[int, Path, float]:
    """Fork a child for ``m``; (pid, its work folder, start time)."""
    work = root / f"m{index}"
    work.mkdir()
    pid = os.fork()
    if pid == 0:
        _child(m, work)
    return pid, work, time.monotonic()


def _stop(pid: int) -> bool:
    """SIGTERM the child's group, then SIGKILL after 5 s; True when SIGTERM did not end it."""
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if os.waitpid(pid, os.WNOHANG)[0]:
            return False
        time.sleep(0.05)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)
    return True


def run_all(mutations: list[Mutation], jobs: int, time_limit: float, keep: bool = False) -> list[Outcome]:
    """Run every mutation, ``jobs`` at a time; their outcomes in order."""
    import csrun.cli.csrun_wse  # noqa: F401  (imported once, before the forks)
    import csrun.run  # noqa: F401
    import csrun.run.shapes_only  # noqa: F401
    import h5py  # noqa: F401
    import torch

    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="csrun-fuzz-"))
    outcomes: dict[int, Outcome] = {}
    running: dict[int, tuple[int, Path, float]] = {}
    queue = list(enumerate(mutations))
    try:
        while queue or running:
            while queue and len(running) < jobs:
                i, m = queue.pop(0)
                running[i] = run_one(m, root, i)
            time.sleep(0.02)
            for i, (pid, work, started) in list(running.items()):
                done, status = os.waitpid(pid, os.WNOHANG)
                elapsed = time.monotonic() - started
                ignored = False
                if done:
                    code: int | None = os.waitstatus_to_exitcode(status)
                    if code is not None and code < 0:
                        code = 128 - code
                elif elapsed > time_limit:
                    ignored, code = _stop(pid), None
                else:
                    continue
                output = (work / "out").read_text(errors="replace") if (work / "out").exists() else ""
                outcomes[i] = Outcome(mutations[i], code, output, elapsed, ignored)
                say_failure(outcomes[i])
                del running[i]
                if not keep:
                    shutil.rmtree(work, ignore_errors=True)
    finally:
        for pid, _, _ in running.values():
            _stop(pid)
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    return [outcomes[i] for i in range(len(mutations))]


def say_failure(o: Outcome) -> None:
    """One line for an outcome that did not pass (as it ends: a long run shows them as it goes)."""
    if o.verdict != "ok":
        last = [ln for ln in o.output.strip().splitlines() if ln.strip()][-1:] or [""]
        extra = " (ignored SIGTERM)" if o.ignored_term else ""
        print(f"{o.verdict.upper():10} [{o.mutation.kind}] {o.mutation.label}: exit {o.code}{extra}: {last[0][:200]}",
              flush=True)


def report(outcomes: list[Outcome]) -> dict[str, int]:
    """Print the counts, by kind and in all; return them by verdict."""
    counts: dict[str, int] = {"run": len(outcomes), "ok": 0, "traceback": 0, "hang": 0, "nonsense": 0,
                              "many-lines": 0}
    for o in outcomes:
        counts[o.verdict] += 1
    by_kind: dict[str, dict[str, int]] = {}
    for o in outcomes:
        row = by_kind.setdefault(o.mutation.kind, {})
        row[o.verdict] = row.get(o.verdict, 0) + 1
    for kind, row in by_kind.items():
        print(f"{kind}: " + ", ".join(f"{k} {v}" for k, v in sorted(row.items())))
    print("total: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return counts


def main(argv: list[str] | None = None) -> int:
    """The command line (module docstring); exit 1 when any mutation did not pass."""
    parser = argparse.ArgumentParser(prog="python -m tests.run.input_fuzz", description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=400, help="mutations to run (0: all)")
    parser.add_argument("--seed", type=int, default=1, help="the order mutations are drawn in")
    parser.add_argument("--jobs", type=int, default=2, help="mutations run at once")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    parser.add_argument("--time-limit", type=float, default=TIME_LIMIT_S, help="seconds per mutation")
    parser.add_argument("--match", default="", help="only mutations whose label contains this")
    parser.add_argument("--keep", action="store_true", help="keep each mutation's folder (its output, params)")
    args = parser.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    mutations = all_mutations(kinds, 0 if args.match else args.count, args.seed)
    if args.match:
        mutations = [m for m in mutations if args.match in m.label][: args.count or None]
    os.environ.pop("CS_IP", None)
    os.environ.pop("CSRUN_LAUNCHER", None)
    started = time.monotonic()
    counts = report(run_all(mutations, args.jobs, args.time_limit, args.keep))
    print(f"{time.monotonic() - started:.0f} s")
    return 0 if counts["ok"] == counts["run"] else 1


if __name__ == "__main__":
    sys.exit(main())
