"""The 2.2.1 Model Zoo, unedited, through csrun: the compatibility table's second release.

``bench/compat/modelzoo.py --zoo DIR`` runs this when ``DIR`` is a ``Release_2.2.1`` checkout of
``Cerebras/modelzoo`` (``src/cerebras/modelzoo``); none of its files is edited or copied here.
It makes small synthetic data in ``--work`` (MNIST IDX files; ``GptHDF5MapDataProcessor`` files,
``data`` of int32 ``[samples, 3, 16]``), writes small float32 params (``max_steps`` N: fc_mnist
with SGD; a tiny GPT-2 with AdamW, a schedule list, ``max_gradient_norm`` and the zoo's
self-sharding ``CBSampler``) and runs each as a user would, from the model's folder, with
``--legacy-imports`` (2.2.1's ``run.py {CPU,CSX}``):

- ``csrun_cpu ... CPU``: 2.2.1's CPU flow (it builds no grad scaler, so it neither scales nor
  clips: its losses are its own);
- ``csrun_cpu ... CSX``: the CSX flow run eagerly on the CPU (csrun_cpu's validation run): the
  reference of every device row;
- ``csrun_wse --total-nodes 1 ... CSX`` (the embedded emulator), ``--compile_only``,
  ``--validate_only``, and ``--mode eval`` from its checkpoint (its metrics too);
- ``csrun_wse --total-nodes 3 ... CSX`` (a chief and two streamers running the input function)
  embedded and against the job's ``cs_emulator`` (``csrun_wse --emulator``), train and eval,
  ``--compile_only`` and ``--validate_only``.
  fc_mnist's own ``DistributedSampler`` gives each streamer every other sample, so its three-task
  batches are not the one-task ones: the reference is the embedded three-task run; GPT-2's
  ``CBSampler`` deals whole batches round the streamers, so its three tasks equal one.

The zoo's own Python dependencies are the user's: installed into ``--deps`` with ``pip install
--target`` (the zoo's pins where they load here: ``transformers==4.34.0``, ``datasets==2.14.5``
with ``pyarrow`` 17 for numpy 2, ``jsonschema``, ``pandas``, ``matplotlib``, ...; numpy and torch
stay the project's); ``torchvision`` is the stand-in in ``bench/compat/stand_ins`` (its absent
names import and raise when used).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import zoo_runs
from zoo_runs import BIN, STAND_INS, Result, make_mnist, print_table

STEP = re.compile(r"\| (Train|Eval) Device=.*?, Step=(\d+), Loss=([0-9.eE+-]+)")
AVG_EVAL = re.compile(r"Avg Eval Loss: ([0-9.eE+-]+)")
METRIC = re.compile(r"Metric: (\S+) = ([0-9.eE+-]+)")

FC_PARAMS = """\
train_input: {{data_dir: "{data}/train", batch_size: 64, drop_last_batch: True, shuffle: False, to_float16: False}}
eval_input: {{data_dir: "{data}/val", batch_size: 64, drop_last_batch: True, shuffle: False, to_float16: False}}
model: {{name: fc_mnist, mixed_precision: False, depth: 3, hidden_size: 50, dropout: 0.0, activation_fn: relu,
         compute_eval_metrics: True}}
optimizer: {{optimizer_type: SGD, learning_rate: 0.001, momentum: 0.9, loss_scaling_factor: 1.0}}
runconfig: {{max_steps: {steps}, checkpoint_steps: {steps}, log_steps: 1, seed: 1}}
"""

GPT2_PARAMS = """\
train_input: {{data_processor: GptHDF5MapDataProcessor, data_dir: "{data}/train", batch_size: 4, shuffle: False,
               num_workers: 0}}
eval_input: {{data_processor: GptHDF5MapDataProcessor, data_dir: "{data}/val", batch_size: 4, shuffle: False,
              num_workers: 0}}
model: {{vocab_size: 64, hidden_size: 32, num_hidden_layers: 2, num_heads: 2, filter_size: 64, dropout_rate: 0.0,
         attention_dropout_rate: 0.0, attention_type: scaled_dot_product, position_embedding_type: learned,
         max_position_embeddings: 16, mixed_precision: False, fp16_type: float16}}
optimizer: {{optimizer_type: AdamW, weight_decay: 0.01, max_gradient_norm: 1.0, loss_scaling_factor: 1.0,
             learning_rate: [{{scheduler: Linear, initial_learning_rate: 0.0, end_learning_rate: 0.001, total_iters: 4}},
                             {{scheduler: Linear, initial_learning_rate: 0.001, end_learning_rate: 0.0,
                               total_iters: 100}}]}}
runconfig: {{max_steps: {steps}, checkpoint_steps: {steps}, log_steps: 1, seed: 1}}
"""

DEPS = ["jsonschema==4.19.2", "six", "keras_preprocessing", "pandas", "matplotlib", "tabulate==0.9.0",
        "transformers==4.34.0", "datasets==2.14.5"]


@dataclass
class Model:
    """One 2.2.1 zoo model in the table."""

    name: str
    folder: Path
    params: Path
    steps: int
    three_tasks_equal_one: bool


def ensure_deps(deps: Path) -> None:
    """The zoo's start-up imports, installed into ``deps`` when missing (the project's numpy and torch kept)."""
    if (deps / "datasets").is_dir() and (deps / "pyarrow").is_dir() and (deps / "jsonschema").is_dir():
        return
    pip = [sys.executable, "-m", "pip", "install", "-q", "--target", str(deps)]
    subprocess.run([*pip, *DEPS], check=True)
    subprocess.run([*pip, "--no-deps", "--upgrade", "pyarrow==17.0.0"], check=True)
    for name in os.listdir(deps):
        if re.match(r"(numpy|torch)([-.].*)?$", name):
            shutil.rmtree(deps / name, ignore_errors=True)


def stand_ins(work: Path) -> Path:
    """A folder with only the torchvision stand-in (2.2.1 imports the real transformers)."""
    folder = work / "stand_ins"
    folder.mkdir(parents=True, exist_ok=True)
    link = folder / "torchvision"
    if not link.exists():
        link.symlink_to(STAND_INS / "torchvision", target_is_directory=True)
    return folder


def make_gpt2_map(data: Path) -> None:
    """Two ``GptHDF5MapDataProcessor`` files per split: ``data`` int32 ``[16, 3, 16]`` (ids, mask, labels)."""
    import h5py

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        (data / split).mkdir(parents=True, exist_ok=True)
        for f in range(2):
            ids = rng.integers(0, 64, (16, 17))
            rows = np.stack([ids[:, :-1], np.ones((16, 16), np.int64), ids[:, 1:]], axis=1).astype(np.int32)
            with h5py.File(data / split / f"data_{f}.h5", "w") as h5:
                h5.create_dataset("data", data=rows)


def run(name: str, argv: list[str], cwd: Path, env: dict[str, str]) -> Result:
    """Run ``argv`` in the model's folder and read what 2.2.1's flow logged (losses, eval metrics)."""
    return zoo_runs.run(name, argv, cwd, env, step=STEP, avg_eval=AVG_EVAL, metric=METRIC)


def rows(model: Model, work: Path, env: dict[str, str]) -> list[tuple[Result, Result | None]]:
    """Every command for ``model``, each with the run it must equal (None: nothing to equal)."""
    cpu = ["csrun_cpu", "--legacy-imports", "python-pt", "run.py"]
    one = ["csrun_wse", "--legacy-imports", "--total-nodes", "1", "python-pt", "run.py"]
    three = ["csrun_wse", "--legacy-imports", "--total-nodes", "3", "python-pt", "run.py"]
    remote = ["csrun_wse", "--emulator", "--legacy-imports", "--total-nodes", "3", "python-pt", "run.py"]

    def flags(target: str, mode: str, model_dir: str, *extra: str) -> list[str]:
        folder = work / f"{model.name}-{model_dir}"
        if mode == "train":
            shutil.rmtree(folder, ignore_errors=True)
        return [target, "--mode", mode, "--params", str(model.params), "--model_dir", str(folder), *extra]

    def go(name: str, argv: list[str]) -> Result:
        return run(f"{model.name} {name}", argv, model.folder, env)

    cpu_train = go("CPU train", cpu + flags("CPU", "train", "cpu"))
    cpu_eval = go("CPU eval", cpu + flags("CPU", "eval", "cpu"))
    ref = go("CSX flow, eager (csrun_cpu) train", cpu + flags("CSX", "train", "eager"))
    ref_eval = go("CSX flow, eager (csrun_cpu) eval", cpu + flags("CSX", "eval", "eager"))
    embedded = go("embedded train", one + flags("CSX", "train", "embedded"))
    streamed = go("3 tasks embedded train", three + flags("CSX", "train", "wse"))
    streamed_eval = go("3 tasks embedded eval", three + flags("CSX", "eval", "wse"))
    three_ref, three_eval_ref = (ref, ref_eval) if model.three_tasks_equal_one else (streamed, streamed_eval)
    return [
        (cpu_train, None), (cpu_eval, None), (ref, None), (ref_eval, None),
        (embedded, ref),
        (go("embedded eval", one + flags("CSX", "eval", "embedded")), ref_eval),
        (go("compile_only", one + flags("CSX", "train", "compile", "--compile_only")), None),
        (go("validate_only", one + flags("CSX", "train", "validate", "--validate_only")), None),
        (streamed, None if three_ref is streamed else three_ref),
        (streamed_eval, None if three_eval_ref is streamed_eval else three_eval_ref),
        (go("3 tasks cs_emulator train", remote + flags("CSX", "train", "wse-remote")), three_ref),
        (go("3 tasks cs_emulator eval", remote + flags("CSX", "eval", "wse-remote")), three_eval_ref),
        (go("3 tasks compile_only", three + flags("CSX", "train", "wse-compile", "--compile_only")), None),
        (go("3 tasks validate_only", three + flags("CSX", "train", "wse-validate", "--validate_only")), None),
    ]


def main(zoo: Path, work: Path, deps: Path | None, steps: int) -> int:
    """Make the data, run the commands, print the table (``zoo``: a Release_2.2.1 checkout)."""
    root = zoo / "src" / "cerebras" / "modelzoo"
    deps = (deps or work / "deps").resolve()
    ensure_deps(deps)
    make_mnist(work / "mnist", samples=64 * (steps + 2))
    make_gpt2_map(work / "gpt2")
    (work / "fc_mnist.yaml").write_text(FC_PARAMS.format(data=work / "mnist", steps=steps))
    (work / "gpt2.yaml").write_text(GPT2_PARAMS.format(data=work / "gpt2", steps=steps))
    models = [Model("fc_mnist", root / "fc_mnist" / "pytorch", work / "fc_mnist.yaml", steps, False),
              Model("GPT-2", root / "models" / "nlp" / "gpt2", work / "gpt2.yaml", steps, True)]
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join([str(stand_ins(work)), str(deps)])}
    table: list[tuple[Result, Result | None]] = []
    for model in models:
        table += rows(model, work, env)
    return print_table("run (Release_2.2.1)", table)
