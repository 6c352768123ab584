"""The 2.2.1 zoo's ``run_cstorch_flow``, in miniature: every call as the zoo makes it.

Writes ``MODEL_DIR/result_<mode>.json`` from the chief (losses, sample ids seen, metrics, the
job's tasks) and a marker ``MODEL_DIR/flow_ran_on_rank_<rank>`` from every task that runs this
flow: on the device path only the chief may.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

import cerebras.pytorch as cstorch
import cerebras.pytorch.distributed as dist
import cerebras_pytorch  # the 2.0.x spelling
from cerebras.appliance.errors import ApplianceNanError
from cerebras.appliance.log import collect_wsc_log_settings, get_level_name, wsc_logger
from cerebras.appliance.run_utils import get_debug_args
from cerebras.appliance.utils.file import create_symlink
from cerebras.minizoo.data import input_fn
from cerebras.minizoo.model import MiniModel
from cerebras.pytorch.core import modes
from cerebras.pytorch.metrics import get_all_metrics
from cerebras.pytorch.saver.pt_h5_saver import PyTorchH5Saver  # noqa: F401 - imported by the zoo's tools
from cerebras.pytorch.sparse import map_sparsity_algorithm  # noqa: F401 - imported by the zoo's configs
from cerebras.pytorch.utils.data.data_executor import MbsSetting  # noqa: F401 - the zoo's annotation
from cerebras.pytorch.utils.nest import visit_torch_tensors

SCHEDULE = [{"scheduler": "Linear", "initial_learning_rate": 0.05, "end_learning_rate": 0.2, "total_iters": 4},
            {"scheduler": "Linear", "initial_learning_rate": 0.2, "end_learning_rate": 0.0, "total_iters": 100}]


def main(argv: list[str]) -> None:
    """``{CPU,CSX} MODEL_DIR STEPS [train|eval] [--no-clip]``."""
    target, model_dir, steps = argv[0], Path(argv[1]), int(argv[2])
    mode = argv[3] if len(argv) > 3 and not argv[3].startswith("--") else modes.TRAIN
    clip = "--no-clip" not in argv
    assert cerebras_pytorch is cstorch and modes.EVAL_ALL == "eval_all"
    wsc_logger.setLevel(get_level_name("info"))
    collect_wsc_log_settings()

    # the zoo's side effects before the backend: a per-second artifact folder (a second task
    # making it in the same second fails), a symlink to it, a marker of who ran the flow
    artifact = model_dir / "cerebras_logs" / mode / time.strftime("%Y%m%d_%H%M%S")
    artifact.mkdir(parents=True)
    create_symlink(model_dir / "cerebras_logs" / "latest", artifact.relative_to(model_dir / "cerebras_logs"),
                   target_is_directory=True)
    (model_dir / f"flow_ran_on_rank_{dist.get_ordinal()}").write_text("ran\n")

    torch.manual_seed(1)
    cs_config = cstorch.utils.CSConfig(
        num_csx=None, max_wgt_servers=None, mgmt_address=None, mgmt_namespace=None, credentials_path=None,
        debug_args=get_debug_args(None), mount_dirs=None, python_paths=None, transfer_processes=None,
        num_workers_per_csx=None, max_act_per_csx=None, job_labels=None, job_priority="p2", job_time_sec=None,
        disable_version_check=False, fabric_type_blacklist=None)
    cs_config.precision_opt_level = 1
    half = cstorch.amp.set_half_dtype("float16")  # the zoo always does; mixed_precision stays off
    assert half == torch.float16 == cstorch.amp.get_half_dtype()
    if target == "CSX":
        backend = cstorch.backend("CSX", artifact_dir=str(artifact), compile_dir=None, compile_only=False,
                                  validate_only=False, retrace_every_iteration=False)
        backend.device.config.lazy_initialization = True
    else:
        backend = cstorch.backend("CPU", artifact_dir=str(artifact), mixed_precision=False)
    assert not backend.is_gpu and backend.backend_type.name == target
    with backend.device:
        model = MiniModel()
    compiled = cstorch.compile(model, backend)
    params = {"train_input": {"batch_size": 8, "to_float16": True}}
    dataloader = cstorch.utils.data.DataLoader(input_fn, params)
    if mode == modes.EVAL:
        evaluate(model, compiled, dataloader, cs_config, model_dir, steps)
        return
    compiled.train()
    groups = cstorch.optim.configure_param_groups(model, {"optimizer_type": "SGD"})
    optimizer = cstorch.optim.configure_optimizer(optimizer_type="SGD", params=groups, learning_rate=SCHEDULE,
                                                  momentum=0.9)
    lr_scheduler = cstorch.optim.configure_lr_scheduler(optimizer, SCHEDULE, None)
    grad_scaler = cstorch.amp.GradScaler(loss_scale=1.0, init_scale=None, steps_per_increase=2000,
                                         min_loss_scale=None, max_loss_scale=None)

    @cstorch.checkpoint_closure
    def save_checkpoint(step: int) -> None:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "lr_scheduler": lr_scheduler.state_dict(), "grad_scaler": grad_scaler.state_dict(),
                 "global_step": step, "__metadata__": [{"version": cstorch.__version__}]}
        if dataloader.is_restartable:
            state["dataloader"] = dataloader.state_dict()
        cstorch.save(state, model_dir / f"checkpoint_{step}.mdl")

    save_checkpoint(0)  # runconfig.save_initial_checkpoint: before the loop
    writer = cstorch.utils.tensorboard.SummaryWriter(log_dir=str(model_dir / "train"), base_step=1)

    @cstorch.trace
    def training_step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        loss = compiled(batch)
        grad_scaler.scale(loss).backward()
        grad_scaler.unscale_(optimizer)
        if clip:
            torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], 0.05)
        grad_scaler.step(optimizer)
        grad_scaler.update()
        optimizer.zero_grad()
        with cstorch.name_scope("lr"):
            lr_scheduler.step()
        cstorch.summarize_scalar("train/step_loss", loss)
        return loss

    losses: list[float] = []
    seen: list[int] = []

    @cstorch.step_closure
    def post_training_step(loss: torch.Tensor, ids: torch.Tensor) -> None:
        if torch.isnan(loss).any().item():
            raise ApplianceNanError("NaN loss detected.")
        losses.append(loss.item())
        seen.extend(ids.tolist())

    num_steps = cstorch.utils.data.compute_num_steps(dataloader, initial_step=0, num_steps=None, max_steps=steps,
                                                     num_epochs=None, steps_per_epoch=None, grad_accum_steps=1)
    with cstorch.profiler.profile(schedule=cstorch.profiler.schedule(start_step=-1, end_step=-1)) as prof:
        executor = cstorch.utils.data.DataExecutor(dataloader, num_steps=num_steps, checkpoint_steps=steps,
                                                   activation_steps=None, cs_config=cs_config, writer=writer,
                                                   listeners=[], micro_batch_size="auto" if backend.is_csx else None)
        for batch in executor:
            loss = training_step(batch)
            post_training_step(loss, batch["id"])
            save_checkpoint(executor.user_iteration)
        final = executor.on_final_iteration
    assert prof.op_profiler_json is None
    writer.flush()
    result = {"losses": losses, "seen": seen, "tasks": dist.num_tasks(), "batches": len(dataloader),
              "final": final, "samples": executor.profiler.rate_tracker.total_samples}
    (model_dir / "result_train.json").write_text(json.dumps(result))


def evaluate(model: torch.nn.Module, compiled: torch.nn.Module, dataloader: object, cs_config: object,
             model_dir: Path, steps: int) -> None:
    """The zoo's eval: load the last checkpoint, run the eval steps, read the metrics."""
    state = cstorch.load(model_dir / f"checkpoint_{steps}.mdl")
    model.load_state_dict(state["model"])
    compiled.eval()
    losses: list[float] = []

    @cstorch.trace
    @torch.no_grad()
    def eval_step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        for _ in visit_torch_tensors(batch, scope=["input"]):
            pass
        return compiled(batch)

    @cstorch.step_closure
    def post_eval_step(loss: torch.Tensor) -> None:
        losses.append(loss.item())

    num_steps = cstorch.utils.data.compute_num_steps(dataloader, num_steps=None, num_epochs=1)
    for batch in cstorch.utils.data.DataExecutor(dataloader, num_steps=num_steps, cs_config=cs_config, writer=None,
                                                 listeners=[], micro_batch_size=None):
        post_eval_step(eval_step(batch))
    metrics = {name: float(metric) for name, metric in get_all_metrics()}
    (model_dir / "result_eval.json").write_text(json.dumps({"losses": losses, "metrics": metrics}))
