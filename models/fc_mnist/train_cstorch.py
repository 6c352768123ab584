"""fc_mnist as a 2.x script (``import csrun.pytorch as cstorch``), reading the same params YAML as run.py.

::

    python train_cstorch.py --params ../../configs/fc_mnist_debug.yaml --model_dir md            # CPU
    python train_cstorch.py --params ... --model_dir md --backend CSX                           # emulator
    python train_cstorch.py --params ... --model_dir md --backend CSX --cs_ip HOST:PORT         # cs_emulator
    python train_cstorch.py --params ... --model_dir md --backend CSX --compile_only
    csrun_wse --total-nodes 3 python-pt train_cstorch.py --params ... --model_dir md --backend CSX

Flags: ``--max_steps`` / ``--checkpoint_steps`` override the YAML's runconfig;
``--checkpoint_path`` resumes from a checkpoint written by this script, by run.py or by
``cbtorch.save(cbtorch.get_state())``. It writes ``model_dir/checkpoint_<step>.mdl`` in
run.py's layout (``model``, ``optimizer``, ``lr_scheduler``, ``amp``/``grad_scaler``,
``global_step``, ``data_position``), so run.py ``--checkpoint_path`` resumes it, and
``model_dir/losses_cstorch.csv`` (``step,loss``, as run.py's ``losses/losses.csv``).
The optimizer, its schedule, loss scaling and clipping come from the YAML's ``optimizer``
section, as run.py takes them.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import numpy as np
import torch

import csrun.pytorch as cstorch
from csrun.program.optimizers import spec_hyperparameters
from csrun.run.params import params_from_dict, read_yaml
from data import train_input_fn
from model import FcMnist, FcMnistConfig, FcMnistInputConfig


def main(argv: list[str] | None = None) -> int:
    """Train fc_mnist with the 2.x API; returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", required=True, help="the params YAML (run.py's)")
    ap.add_argument("--model_dir", required=True, help="checkpoints, losses and compiles go here")
    ap.add_argument("--backend", default="CPU", choices=["CSX", "CPU"], help="CSX: the emulator; CPU: eager")
    ap.add_argument("--cs_ip", default=None, help="HOST[:PORT] of a cs_emulator (default: CS_IP, else embedded)")
    ap.add_argument("--compile_only", action="store_true", help="compile at the first step's end and exit")
    ap.add_argument("--validate_only", action="store_true", help="check at the first step's end and exit")
    ap.add_argument("--checkpoint_path", default=None, help="resume from this checkpoint")
    ap.add_argument("--max_steps", type=int, default=None, help="global step to stop at (default: runconfig)")
    ap.add_argument("--checkpoint_steps", type=int, default=None, help="checkpoint every N steps (default: runconfig)")
    args = ap.parse_args(argv)

    params = params_from_dict(read_yaml(Path(args.params)), model_config=FcMnistConfig,
                              input_config=FcMnistInputConfig)
    rc, opt = params.runconfig, params.optimizer
    model_dir = Path(args.model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    max_steps = args.max_steps or rc.max_steps
    checkpoint_steps = args.checkpoint_steps or rc.checkpoint_steps
    if rc.seed is not None:
        random.seed(rc.seed)
        np.random.seed(rc.seed % 2**32)
        torch.manual_seed(rc.seed)

    if params.model.mixed_precision:
        cstorch.amp.set_half_dtype("cbfloat16" if params.csconfig.use_cbfloat16 else torch.float16)
    backend = cstorch.backend(args.backend, artifact_dir=str(model_dir), cs_ip=args.cs_ip,
                              compile_only=args.compile_only, validate_only=args.validate_only)
    with backend.device:
        model = FcMnist(params.model)
    compiled_model = cstorch.compile(model, backend)

    section = params.to_dict()["optimizer"]
    lr0 = opt.learning_rate if isinstance(opt.learning_rate, (int, float)) else 0.0
    optimizer = cstorch.optim.configure_optimizer(opt.optimizer_type, model.named_parameters(), learning_rate=lr0,
                                                  **spec_hyperparameters(section))
    lr_scheduler = cstorch.optim.configure_lr_scheduler(optimizer, learning_rate=opt.learning_rate)
    grad_scaler = None
    if opt.loss_scaling_factor != 1.0:
        grad_scaler = cstorch.amp.GradScaler(loss_scale=opt.loss_scaling_factor, init_scale=opt.initial_loss_scale,
                                             steps_per_increase=opt.steps_per_increase,
                                             min_loss_scale=opt.min_loss_scale, max_loss_scale=opt.max_loss_scale)

    dataloader = cstorch.utils.data.DataLoader(train_input_fn, params)
    start = 0
    if args.checkpoint_path:
        state = cstorch.load(args.checkpoint_path)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = int(state.get("global_step", 0))
        lr_scheduler.load_state_dict(state.get("lr_scheduler") or {"global_step": start})
        if grad_scaler is not None and state.get("grad_scaler"):
            grad_scaler.load_state_dict(state["grad_scaler"])
        dataloader.streaming().skip(int(state.get("data_position", start)))
    if start >= max_steps:
        print(f"fc_mnist (cstorch): already at step {start} of {max_steps}")
        return 0

    executor = cstorch.utils.data.DataExecutor(dataloader, num_steps=max_steps - start,
                                               checkpoint_steps=checkpoint_steps)
    losses_file = model_dir / "losses_cstorch.csv"
    if start == 0:
        losses_file.write_text("step,loss\n")

    @cstorch.trace
    def training_step(batch):
        loss = compiled_model(batch)["loss"]
        cstorch.amp.optimizer_step(loss, optimizer, grad_scaler, max_gradient_norm=opt.max_gradient_norm,
                                   max_gradient_value=opt.max_gradient_value)
        return loss

    @cstorch.step_closure
    def log_loss(step: int, loss: torch.Tensor) -> None:
        with losses_file.open("a") as f:
            f.write(f"{step},{loss.item()!r}\n")
        if step % rc.log_steps == 0:
            print(f"| Train: step {step}, loss {loss.item():.6f}", flush=True)

    @cstorch.checkpoint_closure
    def save_checkpoint(step: int) -> None:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "lr_scheduler": lr_scheduler.state_dict(), "global_step": step, "data_position": step}
        if grad_scaler is not None:
            state["grad_scaler"] = grad_scaler.state_dict()
        cstorch.save(state, model_dir / f"checkpoint_{step}.mdl")

    for batch in executor:
        step = start + executor.step
        log_loss(step, training_step(batch))
        save_checkpoint(step)
    print("fc_mnist (cstorch): training completed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
