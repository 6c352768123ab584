"""A 2.x training script (the slides' skeleton, shortened) whose CSConfig states the systems:
the same file for one system and for a cluster, as a user's script.

    python cluster_2x.py NUM_CSX OUT_DIR

The global batch is 16 (``get_streaming_batch_size`` makes it 16 // NUM_CSX per system, as the
2.2.1 zoo's loaders do); 20 steps of SGD with momentum, clipping and dynamic loss scaling on the
device; the losses go to OUT_DIR/losses.txt.
"""
import os
import sys

import torch

import csrun.pytorch as cstorch
from tiny import Model, get_train_dataloader, write_losses

GLOBAL_BATCH, STEPS = 16, 20
NUM_CSX, OUT = int(sys.argv[1]), sys.argv[2]
torch.manual_seed(0)
os.makedirs(OUT, exist_ok=True)
losses = []

backend = cstorch.backend("CSX", artifact_dir=os.path.join(OUT, "artifacts"))
with backend.device:
    model = Model()
compiled_model = cstorch.compile(model, backend)
loss_fn = torch.nn.NLLLoss()
optimizer = cstorch.optim.configure_optimizer(optimizer_type="SGD", params=model.parameters(), learning_rate=0.05,
                                              momentum=0.9)
grad_scaler = cstorch.amp.GradScaler(loss_scale="dynamic")


@cstorch.trace
def training_step(batch):
    inputs, targets = batch
    loss = loss_fn(compiled_model(inputs), targets)
    cstorch.amp.optimizer_step(loss, optimizer, grad_scaler, max_gradient_norm=1.0)
    return loss


@cstorch.step_closure
def record(loss: torch.Tensor):
    losses.append(loss.item())


def input_fn():
    return get_train_dataloader(cstorch.distributed.get_streaming_batch_size(GLOBAL_BATCH))


executor = cstorch.utils.data.DataExecutor(cstorch.utils.data.DataLoader(input_fn), num_steps=STEPS,
                                           cs_config=cstorch.utils.CSConfig(num_csx=NUM_CSX))
for batch in executor:
    record(training_step(batch))

if cstorch.distributed.is_master_ordinal():
    write_losses(os.path.join(OUT, "losses.txt"), losses)
