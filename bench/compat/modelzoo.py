"""The R1.6 Model Zoo, unedited, through csrun: a compatibility table.

Command (from the repository root)::

    .venv/bin/python bench/compat/modelzoo.py --zoo DIR [--work DIR] [--deps DIR] [--steps N]

``--zoo`` is a checkout of ``Cerebras/modelzoo`` at tag ``R_1.6.0`` (``git clone --branch R_1.6.0
https://github.com/Cerebras/modelzoo``); none of its files is edited or copied here. A checkout
of ``Release_2.2.1`` runs that release's table instead (:mod:`modelzoo2`). The check
makes small synthetic data in ``--work`` (a fresh temporary folder by default): MNIST IDX files,
``GptHDF5DataProcessor`` files (one per streamer) and a ``BertCSVDynamicMaskDataProcessor`` CSV
with its vocab; writes small float32 params (``max_steps`` N) for the zoo's fc_mnist (with its
SGD, and again with its own AdamW), a tiny GPT-2 and a tiny BERT; and runs each as a user would,
from the zoo's root, with ``--legacy-imports``:

- ``csrun_cpu`` on the CPU (the reference), then with ``--cs_ip embedded`` (the zoo appends
  ``:9000``), against a ``cs_emulator`` server (``--cs_ip 127.0.0.1:PORT``, a fresh token),
  ``--compile_only``, ``--validate_only``, and ``--mode eval`` from each path's checkpoint
  (embedded and against the server);
- ``csrun_wse --total-nodes 3`` (a chief and two streamers; the zoo shards its own input over
  them) with ``--cs_ip embedded`` (train and eval), against a ``cs_emulator`` (train and eval), ``--compile_only``
  and ``--validate_only``, when a Slurm cluster answers (``SLURM_CONF``).

The zoo's own Python dependencies are the user's: ``torchvision`` (its PyPI wheel does not load
against the CPU torch this project pins), ``nltk`` and the one name its Hugging Face code takes
from ``transformers`` come from the small stand-ins in ``bench/compat/stand_ins``; the pure-Python
rest (``keras_preprocessing``, ``regex``, ``sacremoses``, an R1.6-era ``huggingface_hub``, ...) is
installed into ``--deps`` (default ``WORK/deps``) with ``pip install --target`` unless it is there;
its pinned ``tokenizers<0.11`` (no wheel for Python 3.11, unused here) is a placeholder there.

Prints one markdown table: each command, its exit code, the last step it logged, its last loss,
and whether its losses equal its reference's (to 1e-5): the CPU run's for one task, the embedded
three-task run's for three tasks against ``cs_emulator`` (the zoo's GPT-2 and BERT losses are
float16 values, so equal at their precision).
"""

from __future__ import annotations

import argparse
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import zoo_runs
from zoo_runs import BIN, STAND_INS, Result, make_mnist, print_table

STEP = re.compile(r"\| (Train|Eval) Device=\S+ Step=(\d+) Loss=([0-9.eE+-]+)")
AVG_EVAL = re.compile(r"Avg Eval\. Loss = ([0-9.eE+-]+)")
PARAMS = """\
train_input:
    data_dir: "{data}/train"
    batch_size: 64
    drop_last_batch: True
    shuffle: False
    to_float16: False
eval_input:
    data_dir: "{data}/val"
    batch_size: 64
    drop_last_batch: True
    shuffle: False
    to_float16: False
model:
    name: "fc_mnist"
    mixed_precision: False
    depth: 3
    hidden_size: 50
    dropout: 0.0
    activation_fn: "relu"
optimizer:
    optimizer_type: "SGD"
    learning_rate: 0.001
    momentum: 0.9
    loss_scaling_factor: 1.0
runconfig:
    max_steps: {steps}
    checkpoint_steps: {steps}
    log_steps: 1
    seed: 1
    save_losses: True
"""


GPT2_PARAMS = """\
train_input: {{data_processor: GptHDF5DataProcessor, data_dir: "{data}/train", max_sequence_length: 16,
               batch_size: 4, shuffle: False, num_workers: 1}}
eval_input: {{data_processor: GptHDF5DataProcessor, data_dir: "{data}/val", max_sequence_length: 16,
              batch_size: 4, shuffle: False, num_workers: 1}}
model: {{vocab_size: 64, hidden_size: 32, num_hidden_layers: 2, num_heads: 2, filter_size: 64, dropout_rate: 0.0,
         attention_dropout_rate: 0.0, attention_type: scaled_dot_product, position_embedding_type: learned,
         max_position_embeddings: 16, mixed_precision: False}}
optimizer: {{optimizer_type: AdamW, learning_rate: 0.001, weight_decay_rate: 0.01}}
runconfig: {{max_steps: {steps}, log_steps: 1, checkpoint_steps: {steps}, seed: 1}}
"""
"""A tiny GPT-2 (``num_workers: 1``: R1.6's loader passes ``prefetch_factor`` even without workers,
which today's torch refuses)."""


BERT_PARAMS = """\
train_input: {{data_processor: BertCSVDynamicMaskDataProcessor, data_dir: "{data}/train", vocab_file: "{data}/vocab.txt",
               max_sequence_length: 16, max_predictions_per_seq: 4, batch_size: 4, shuffle: False, shuffle_seed: 1,
               num_workers: 0}}
eval_input: {{data_processor: BertCSVDynamicMaskDataProcessor, data_dir: "{data}/val", vocab_file: "{data}/vocab.txt",
              max_sequence_length: 16, max_predictions_per_seq: 4, batch_size: 4, shuffle: False, shuffle_seed: 1,
              num_workers: 0}}
model: {{vocab_size: 32, hidden_size: 32, num_hidden_layers: 2, num_heads: 2, filter_size: 64,
         encoder_nonlinearity: gelu, dropout_rate: 0.0, attention_dropout_rate: 0.0, mlm_loss_weight: 1.0,
         layer_norm_epsilon: 1.0e-5, mixed_precision: False}}
optimizer: {{optimizer_type: AdamW, learning_rate: 0.0001}}
runconfig: {{max_steps: {steps}, log_steps: 1, checkpoint_steps: {steps}, seed: 1}}
"""
"""A tiny BERT (dynamic masking seeded, so the CPU path repeats itself)."""


def make_bert(data: Path) -> None:
    """A vocab and one dynamic-masking CSV (with its ``meta.dat``) per split."""
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(20)]
    data.mkdir(parents=True, exist_ok=True)
    (data / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    for split in ("train", "val"):
        (data / split).mkdir(exist_ok=True)
        rows = []
        for i in range(32):
            a, b = list(rng.choice(words, 5, replace=False)), list(rng.choice(words, 6, replace=False))
            tokens = ["[CLS]", *a, "[SEP]", *b, "[SEP]"]
            segments = [0] * (len(a) + 2) + [1] * (len(b) + 1)
            rows.append(f'"{tokens}","{segments}",{i % 2}')
        (data / split / "data_0.csv").write_text("tokens,segment_ids,is_random_next\n" + "\n".join(rows) + "\n")
        (data / split / "meta.dat").write_text(f"data_0.csv {len(rows)}\n")


def hide_tokenizers(deps: Path) -> None:
    """The zoo's Hugging Face code checks ``tokenizers<0.11`` at import (none has a wheel for Python
    3.11) and these runs never use it: a placeholder that raises when imported, with the pinned
    version's metadata, stands in the deps folder."""
    (deps / "tokenizers").mkdir(parents=True, exist_ok=True)
    (deps / "tokenizers" / "__init__.py").write_text(
        'raise ImportError("bench/compat/modelzoo.py: a placeholder for the zoo\'s pinned tokenizers<0.11")\n')
    meta = deps / "tokenizers-0.10.3.dist-info"
    meta.mkdir(exist_ok=True)
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: tokenizers\nVersion: 0.10.3\n")


@dataclass
class Model:
    """One zoo model in the table."""

    name: str
    script: Path
    params: Path
    steps: int


def ensure_deps(deps: Path) -> None:
    """The zoo's start-up imports that have no stand-in, installed into ``deps`` when missing."""
    if (deps / "keras_preprocessing").is_dir() and (deps / "urllib3").is_dir():
        return
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(deps),
                    "keras_preprocessing", "six", "regex", "sacremoses", "joblib", "click", "requests", "filelock",
                    "tqdm", "urllib3", "idna", "certifi", "charset_normalizer", "huggingface_hub==0.10.1"], check=True)


def make_gpt2(data: Path, msl: int = 16) -> None:
    """Two ``GptHDF5DataProcessor`` files per split (``example_i``: int32 ids, mask, next ids)."""
    import h5py

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        (data / split).mkdir(parents=True, exist_ok=True)
        for f in range(2):
            with h5py.File(data / split / f"data_{f}.h5", "w") as h5:
                h5.attrs["n_examples"] = 16
                for i in range(16):
                    ids = rng.integers(0, 64, msl + 1)
                    h5.create_dataset(f"example_{i}", data=np.stack([ids[:-1], np.ones(msl, np.int64), ids[1:]])
                                      .astype(np.int32))


def run(name: str, argv: list[str], zoo: Path, env: dict[str, str]) -> Result:
    """Run ``argv`` from the zoo's root and read the losses R1.6's runner logged."""
    return zoo_runs.run(name, argv, zoo, env, step=STEP, avg_eval=AVG_EVAL)


def remote_run(name: str, argv: list[str], zoo: Path, env: dict[str, str]) -> Result:
    """``argv`` with ``--cs_ip`` at a ``cs_emulator`` started for it (a fresh token), which is stopped after."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**env, "CSRUN_EMULATOR_TOKEN": secrets.token_hex(24)}
    server = subprocess.Popen([str(BIN / "cs_emulator"), "--listen", f"127.0.0.1:{port}"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert server.stdout is not None
        for line in server.stdout:  # its first line says it listens
            if "listening on" in line:
                break
        return run(name, argv + ["--cs_ip", f"127.0.0.1:{port}"], zoo, env)
    finally:
        server.terminate()
        server.wait(timeout=30)


def rows(model: Model, work: Path, zoo: Path, env: dict[str, str], slurm: bool) -> list[tuple[Result, Result | None]]:
    """Every command for ``model``, each with the run it must equal (None: nothing to equal)."""
    cpu = ["csrun_cpu", "--legacy-imports", "python-pt", str(model.script)]
    wse = ["csrun_wse", "--legacy-imports", "--total-nodes", "3", "python-pt", str(model.script)]

    def flags(mode: str, model_dir: str, *extra: str) -> list[str]:
        target = work / f"{model.name}-{model_dir}"
        if mode == "train":
            shutil.rmtree(target, ignore_errors=True)
        return ["--mode", mode, "--params", str(model.params), "--model_dir", str(target), *extra]

    def checkpoint(model_dir: str) -> list[str]:
        return ["--checkpoint_path", str(work / f"{model.name}-{model_dir}" / f"checkpoint_{model.steps}.mdl")]

    train = run(f"{model.name} CPU train", cpu + flags("train", "cpu"), zoo, env)
    evaluate = run(f"{model.name} CPU eval", cpu + flags("eval", "cpu", *checkpoint("cpu")), zoo, env)
    out: list[tuple[Result, Result | None]] = [
        (train, None),
        (run(f"{model.name} embedded train", cpu + flags("train", "embedded", "--cs_ip", "embedded"), zoo, env),
         train),
        (remote_run(f"{model.name} cs_emulator train", cpu + flags("train", "remote"), zoo, env), train),
        (run(f"{model.name} compile_only", cpu + flags("train", "compile", "--compile_only"), zoo, env), None),
        (run(f"{model.name} validate_only", cpu + flags("train", "validate", "--validate_only"), zoo, env), None),
        (evaluate, None),
        (run(f"{model.name} embedded eval", cpu + flags("eval", "embedded", "--cs_ip", "embedded",
                                                        *checkpoint("embedded")), zoo, env), evaluate),
        (remote_run(f"{model.name} cs_emulator eval", cpu + flags("eval", "remote", *checkpoint("remote")), zoo, env),
         evaluate),
    ]
    if slurm:
        streamed = run(f"{model.name} 3 tasks train", wse + flags("train", "wse", "--cs_ip", "embedded"), zoo, env)
        streamed_eval = run(f"{model.name} 3 tasks eval",
                            wse + flags("eval", "wse", "--cs_ip", "embedded", *checkpoint("wse")), zoo, env)
        out += [
            (streamed, None),
            (streamed_eval, None),
            (remote_run(f"{model.name} 3 tasks cs_emulator train", wse + flags("train", "wse-remote"), zoo, env),
             streamed),
            (remote_run(f"{model.name} 3 tasks cs_emulator eval",
                        wse + flags("eval", "wse-remote", *checkpoint("wse-remote")), zoo, env), streamed_eval),
            (run(f"{model.name} 3 tasks compile_only", wse + flags("train", "wse-compile", "--compile_only"), zoo,
                 env), None),
            (run(f"{model.name} 3 tasks validate_only", wse + flags("train", "wse-validate", "--validate_only"), zoo,
                 env), None),
        ]
    return out


def main() -> int:
    """Make the data, run the commands, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--zoo", required=True, type=Path,
                        help="a checkout of Cerebras/modelzoo at R_1.6.0 or Release_2.2.1")
    parser.add_argument("--work", type=Path, default=None, help="where the data and model_dirs go (default: a temp dir)")
    parser.add_argument("--deps", type=Path, default=None, help="the zoo's pip dependencies (default WORK/deps)")
    parser.add_argument("--steps", type=int, default=8, help="max_steps (default 8)")
    args = parser.parse_args()
    zoo = args.zoo.resolve()
    root = zoo / "modelzoo"
    work = (args.work or Path(tempfile.mkdtemp(prefix="csrun-zoo-"))).resolve()
    if (zoo / "src" / "cerebras" / "modelzoo" / "fc_mnist" / "pytorch" / "run.py").is_file():  # Release_2.2.1
        import modelzoo2

        return modelzoo2.main(zoo, work, args.deps, args.steps)
    if not (root / "fc_mnist" / "pytorch" / "run.py").is_file():
        parser.error(f"--zoo {args.zoo}: no modelzoo/fc_mnist/pytorch/run.py there (give a R_1.6.0 or "
                     f"Release_2.2.1 checkout)")
    deps = (args.deps or work / "deps").resolve()
    ensure_deps(deps)
    hide_tokenizers(deps)
    make_mnist(work / "mnist", samples=64 * (args.steps + 2))
    make_gpt2(work / "gpt2")
    make_bert(work / "bert")
    configs = {"fc_mnist": PARAMS.format(data=work / "mnist", steps=args.steps),
               "fc_mnist-AdamW": PARAMS.format(data=work / "mnist", steps=args.steps).replace(
                   '    optimizer_type: "SGD"\n',
                   '    optimizer_type: "AdamW"\n    weight_decay_rate: 0.01\n    correct_bias: True\n',
               ).replace("    momentum: 0.9\n", ""),
               "GPT-2": GPT2_PARAMS.format(data=work / "gpt2", steps=args.steps),
               "BERT": BERT_PARAMS.format(data=work / "bert", steps=args.steps)}
    scripts = {"fc_mnist": root / "fc_mnist" / "pytorch" / "run.py",
               "fc_mnist-AdamW": root / "fc_mnist" / "pytorch" / "run.py",
               "GPT-2": root / "transformers" / "pytorch" / "gpt2" / "run.py",
               "BERT": root / "transformers" / "pytorch" / "bert" / "run.py"}
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": os.pathsep.join([str(STAND_INS), str(deps), str(zoo)])}
    table: list[tuple[Result, Result | None]] = []
    for name, text in configs.items():
        params = work / f"{name}.yaml"
        params.write_text(text)
        table += rows(Model(name=name, script=scripts[name], params=params, steps=args.steps), work, zoo, env,
                      slurm=bool(os.environ.get("SLURM_CONF")))
    return print_table("run", table)


if __name__ == "__main__":
    sys.exit(main())
