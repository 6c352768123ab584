"""The README's main job's config trained by a plain eager PyTorch loop on one device: the
baseline of ``bench/e2e/main_job.py --gpu`` (eager PyTorch on the same GPU as ``--emulator cuda``).

Command (from the repository root)::

    python bench/e2e/eager_on_gpu.py --params configs/fc_mnist.yaml -o MODEL_DIR [--device cuda] [--steps N]

Builds models/fc_mnist's model, its train loader (models/fc_mnist/data.py, the config's
``train_input``) and the optimizer the config names (SGD at its learning rate and momentum),
seeds as ``runconfig.seed`` says, and runs ``runconfig.max_steps`` steps (``--steps``: that many)
on the device, under float16 autocast when the config asks for ``mixed_precision`` (what the
emulator does on CUDA), reading the loss to the host every ``log_steps`` steps as the runner's
log does. Writes ``MODEL_DIR/performance/performance.json`` with ``samples_per_sec``,
``total_samples`` and ``total_time`` (the loop's seconds), the runner's keys.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "models" / "fc_mnist"))  # run.py's siblings, as run.py imports them

from csrun.run.params import params_from_dict  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", required=True)
    ap.add_argument("-o", "--model_dir", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--steps", type=int, default=None)
    args = ap.parse_args()
    raw = yaml.safe_load(Path(args.params).read_text())
    model_mod, data_mod = importlib.import_module("model"), importlib.import_module("data")
    params = params_from_dict(raw, model_config=model_mod.FcMnistConfig, input_config=model_mod.FcMnistInputConfig)
    run, opt = raw.get("runconfig", {}), raw.get("optimizer", {})
    torch.manual_seed(int(run.get("seed", 0)))
    device = torch.device(args.device)
    model = model_mod.FcMnist(params.model).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=float(opt["learning_rate"]), momentum=float(opt.get("momentum", 0)))
    steps = args.steps or int(run["max_steps"])
    log_steps = int(run.get("log_steps", 50))
    half = bool(raw.get("model", {}).get("mixed_precision")) and device.type == "cuda"
    loader = data_mod.train_input_fn(params)
    done, samples = 0, 0
    start = time.perf_counter()
    while done < steps:
        for images, labels in loader:
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=torch.float16, enabled=half):
                loss = model((images, labels))["loss"]
            optimizer.zero_grad(set_to_none=True)
            loss.float().backward()
            optimizer.step()
            done += 1
            samples += int(labels.shape[0])
            if done % log_steps == 0:
                float(loss.detach())
            if done == steps:
                break
    float(loss.detach())
    total = time.perf_counter() - start
    out = Path(args.model_dir) / "performance"
    out.mkdir(parents=True, exist_ok=True)
    (out / "performance.json").write_text(json.dumps({"samples_per_sec": samples / total, "total_samples": samples,
                                                      "total_time": total, "compile_time": 0.0}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
