# The slides' 2.x skeleton ("Cerebras PyTorch API: a simple skeleton of a full training script", seed 001),
# completed with a small model and data: the slide's `...` are filled in, the import line is changed,
# and the backend type comes from the command line (the slide has "CSX"). Lines marked "slide" are the
# slide's own. The skeleton calls training_step(dataloader): the executor's DataLoader stands for the batch.
# argv: BACKEND (CSX | CPU) OUT_DIR LOSS_SCALE (0 | dynamic) [CHECKPOINT_PATH] [CS_IP]
import os
import sys

import torch
import csrun.pytorch as cstorchtch                                                   # slide (the import line)
from tiny import Model, get_train_dataloader, write_losses

torch.manual_seed(0)
BACKEND, OUT = sys.argv[1], sys.argv[2]
loss_scale = 0.0 if sys.argv[3] == "0" else sys.argv[3]
checkpoint_path = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] != "-" else None
backend_args = {"artifact_dir": os.path.join(OUT, "artifacts")}
if len(sys.argv) > 5:
    backend_args["cs_ip"] = sys.argv[5]
os.makedirs(OUT, exist_ok=True)
os.chdir(OUT)  # the slide writes checkpoint_{step}.mdl in the working directory
losses = []

backend = cstorchtch.backend(BACKEND, **backend_args)                                # slide ("CSX", ...)

with backend.device:                                                                 # slide
    # user defined model                                                             # slide
    model: torch.nn.Module = Model()                                                 # slide (...)

compiled_model = cstorchtch.compile(model, backend)                                  # slide

loss_fn: torch.nn.Module = torch.nn.NLLLoss()                                        # slide (...)

optimizer: cstorchtch.optim.Optimizer = cstorchtch.optim.configure_optimizer(        # slide
    optimizer_type="SGD",                                                            # slide ("...")
    params=model.parameters(),                                                       # slide
    learning_rate=0.05, momentum=0.9,                                                # slide (...)
)                                                                                    # slide
lr_scheduler: cstorchtch.optim.lr_scheduler.LRScheduler = cstorchtch.optim.configure_lr_scheduler(  # slide
    optimizer, learning_rate={"scheduler": "Linear", "initial_learning_rate": 0.05,  # slide (...)
                              "end_learning_rate": 0.005, "steps": 1000},
)                                                                                    # slide

grad_scaler = None                                                                   # slide
if loss_scale != 0.0:                                                                # slide
    grad_scaler = cstorchtch.amp.GradScaler(loss_scale=loss_scale)                   # slide (...)


@cstorchtch.checkpoint_closure                                                       # slide
def save_checkpoint(step):                                                           # slide
    checkpoint_file = f"checkpoint_{step}.mdl"                                       # slide

    state_dict = {                                                                   # slide
        "model": model.state_dict(),                                                 # slide
        "optimizer": optimizer.state_dict(),                                         # slide
    }                                                                                # slide
    if lr_scheduler:                                                                 # slide
        state_dict["lr_scheduler"] = lr_scheduler.state_dict()                       # slide
    if grad_scaler:                                                                  # slide
        state_dict["grad_scaler"] = grad_scaler.state_dict()                         # slide

    state_dict["global_step"] = step                                                 # slide

    cstorchtch.save(state_dict, checkpoint_file)                                     # slide


global_step = 0                                                                      # slide

# Load checkpoint if provided                                                        # slide
if checkpoint_path is not None:                                                      # slide
    state_dict = cstorchtch.load(checkpoint_path)                                    # slide

    model.load_state_dict(state_dict["model"])                                       # slide
    optimizer.load_state_dict(state_dict["optimizer"])                               # slide
    if lr_scheduler:                                                                 # slide
        lr_scheduler.load_state_dict(state_dict["lr_scheduler"])                     # slide
    if grad_scaler:                                                                  # slide
        grad_scaler.load_state_dict(state_dict["grad_scaler"])                       # slide

    global_step = state_dict.get("global_step", 0)                                   # slide


@cstorchtch.compile_step                                                             # slide
def training_step(batch):                                                            # slide
    inputs, targets = batch                                                          # slide
    outputs = compiled_model(inputs)                                                 # slide
    loss = loss_fn(outputs, targets)                                                 # slide

    cstorchtch.amp.optimizer_step(                                                   # slide
        loss, optimizer, grad_scaler, max_gradient_norm=1.0                          # slide
    )                                                                                # slide

    return loss                                                                      # slide


@cstorchtch.step_closure                                                             # slide
def post_training_step(loss: torch.Tensor):                                          # slide
    print("Loss: ", loss.item())                                                     # slide
    losses.append(loss.item())


dataloader = cstorchtch.utils.data.DataLoader(                                       # slide
    get_train_dataloader,                                                            # slide (train_data_loader_fn)
    8,                                                                               # slide (...)
)                                                                                    # slide
executor = cstorchtch.utils.data.DataExecutor(                                       # slide
    dataloader=dataloader,                                                           # slide
    num_steps=1000,                                                                  # slide
    checkpoint_steps=100,                                                            # slide
    cs_config=cstorchtch.utils.CSConfig(num_csx=1),                                  # slide (...)
)                                                                                    # slide

for i, batch in enumerate(executor):                                                 # slide
    loss = training_step(dataloader)                                                 # slide

    post_training_step(loss)                                                         # slide

    # Always call save_checkpoint, but is only truly                                 # slide
    # run every 100 steps                                                            # slide
    save_checkpoint(i)                                                               # slide

write_losses("losses.txt", losses)
