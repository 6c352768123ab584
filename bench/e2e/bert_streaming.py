"""BERT debug through csrun_wse (embedded emulator, 1/2/4 streamers) over a plain PyTorch loop.

Command (from the repository root; uses the local Slurm cluster when ``SLURM_CONF`` points at
one with 4 workers, else csrun_wse's mpiexec fallback)::

    OMP_NUM_THREADS=1 .venv/bin/python bench/e2e/bert_streaming.py [--steps 200] [--delay-ms 40]

The model and data are ``configs/bert_debug.yaml`` (2 layers, hidden 64, MSL 32, batch 16,
the bundled HDF5 shards). Every batch costs ``--delay-ms`` extra in the input pipeline (a
sleep in the collate function, standing in for decoding and augmentation), so input costs
dominate as the issue asks. Baseline: one process, DataLoader + model + AdamW + the same
schedule, float32. csrun: ``models/bert``'s model and input function through
``csrun.run.run`` under ``csrun_wse --total-nodes N+1 --tasks-per-node 1`` (N streamers),
``mixed_precision: false`` so the compute is the same; its figure is performance.json's
``samples_per_sec`` (from the first batch request, so the compile (~1-2 s) is included).
Prints one markdown table of ratios measured in the same run (target >= 1.0).

``--task`` is the mode csrun_wse runs on every task (not for users).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import yaml

REPO = Path(__file__).resolve().parents[2]
BERT = REPO / "models" / "bert"


def _load(name: str) -> ModuleType:
    """models/bert/<name>.py as a module (run.py-style sibling imports, without sys.path edits)."""
    spec = importlib.util.spec_from_file_location(f"bench_bert_{name}", BERT / f"{name}.py")
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {BERT / name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and type hints look their module up there
    spec.loader.exec_module(module)
    return module


def _params_yaml(folder: Path, steps: int) -> Path:
    params = yaml.safe_load((REPO / "configs" / "bert_debug.yaml").read_text())
    params["model"]["mixed_precision"] = False
    params["runconfig"].update(max_steps=steps, checkpoint_steps=0, log_steps=steps, save_losses=False)
    params["runconfig"].pop("save_initial_checkpoint", None)
    path = folder / "bert_bench.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def _delayed(loader_fn: Callable[[Any], Any], delay_s: float) -> Callable[[Any], Any]:
    """The input function with ``delay_s`` of extra work per batch (in collate)."""
    from torch.utils.data import DataLoader

    def make(params: Any) -> Any:
        base = loader_fn(params)

        def collate(samples: list[Any]) -> Any:
            time.sleep(delay_s)
            return base.collate_fn(samples)

        return DataLoader(base.dataset, batch_size=base.batch_size, drop_last=True, collate_fn=collate)

    return make


def task(argv: list[str]) -> int:
    """What every task of the csrun_wse job runs: the runner on BERT with the delayed input."""
    from csrun.run import run

    delay = float(argv[argv.index("--delay-ms") + 1]) / 1000
    rest = argv[argv.index("--") + 1:]
    data, model = _load("data"), _load("model")
    return run(model_fn=model.bert_model, train_input_fn=_delayed(data.train_input_dataloader, delay), eval_input_fn=None,
               model_config=model.BertConfig, input_config=data.BertInputConfig, argv=rest)


def plain(params_path: Path, delay_s: float, steps: int) -> float:
    """Samples/s of a single-process loop on the same model, data and optimizer."""
    import torch

    from csrun.program.schedules import build_schedule
    from csrun.run.params import params_from_dict

    data, model_mod = _load("data"), _load("model")
    params = params_from_dict(yaml.safe_load(params_path.read_text()), model_config=model_mod.BertConfig, input_config=data.BertInputConfig)
    torch.manual_seed(0)
    model = model_mod.bert_model(params)
    opt = torch.optim.AdamW(model.parameters(), lr=0.0, weight_decay=params.optimizer.weight_decay_rate)
    schedule = build_schedule(params.optimizer.learning_rate)
    loader = _delayed(data.train_input_dataloader, delay_s)(params)
    done, samples = 0, 0
    start = time.perf_counter()
    while done < steps:
        for batch in loader:
            for g in opt.param_groups:
                g["lr"] = schedule(done)
            loss = model(batch)["loss"]
            loss.backward()
            opt.step()
            opt.zero_grad()
            done += 1
            samples += params.train_input.batch_size
            if done >= steps:
                break
    float(loss.detach())
    return samples / (time.perf_counter() - start)


def through_csrun(params_path: Path, delay_ms: float, streamers: int, folder: Path) -> float:
    """Samples/s from performance.json of one csrun_wse run with ``streamers`` streamers."""
    md = folder / f"md{streamers}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "CSRUN_PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    argv = [str(REPO / "bin" / "csrun_wse"), "--logging", "False", "--total-nodes", str(streamers + 1), "--tasks-per-node", "1",
            str(REPO / "bin" / "python-pt"), str(Path(__file__).resolve()), "--task", "--delay-ms", str(delay_ms), "--",
            "--mode", "train", "--params", str(params_path), "-o", str(md)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"csrun_wse with {streamers} streamers failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return float(json.loads((md / "performance" / "performance.json").read_text())["samples_per_sec"])


def main() -> int:
    """Run the baseline and the csrun rows; print the table."""
    if "--task" in sys.argv:
        return task(sys.argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--delay-ms", type=float, default=40.0)
    parser.add_argument("--streamers", default="1,2,4")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="csrun-bench-bert-") as tmp:
        folder = Path(tmp)
        params_path = _params_yaml(folder, args.steps)
        base = plain(params_path, args.delay_ms / 1000, args.steps)
        print(f"{args.steps} steps of BERT debug (batch 16, MSL 32), {args.delay_ms:g} ms input cost per batch, float32")
        print("| measurement | csrun samples/s | plain loop samples/s | ratio | target |")
        print("|---|---|---|---|---|")
        for n in [int(x) for x in args.streamers.split(",")]:
            rate = through_csrun(params_path, args.delay_ms, n, folder)
            print(f"| BERT debug, csrun_wse embedded emulator, {n} streamer(s) | {rate:,.0f} | {base:,.0f} | {rate / base:.2f} | >= 1.0 |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
