# The slides' first 2.x script (seed 001, "Running on Cerebras Wafer-Scale Cluster using cstorch API"),
# completed with a small model and data. Lines marked "slide" are the slide's, unchanged but for the import.
# argv: BACKEND (CSX | CPU) OUT_FILE [CS_IP]
import sys

import torch
import csrun.pytorch as cstorch                                                    # slide (the import line)
from tiny import Model, get_train_dataloader, write_losses

torch.manual_seed(0)
BACKEND, OUT = sys.argv[1], sys.argv[2]
if len(sys.argv) > 3:
    cstorch.backend(BACKEND, cs_ip=sys.argv[3])


losses = []
model: torch.nn.Module = Model()                                                   # slide
model = cstorch.compile(model, BACKEND)                                            # slide ("CSX")
loss_fn = torch.nn.NLLLoss()                                                       # slide
optimizer = cstorch.optim.SGD(model.parameters(), lr=0.01)                         # slide
dataloader = cstorch.utils.data.DataLoader(get_train_dataloader)                   # slide
executor = cstorch.utils.data.DataExecutor(                                        # slide
    dataloader                                                                     # slide
)                                                                                  # slide


@cstorch.trace                                                                     # slide
def training_step(inputs, targets):                                                # slide
    optimizer.zero_grad()                                                          # slide
    outputs = model(inputs)                                                        # slide
    loss = loss_fn(outputs, targets)                                               # slide
    loss.backward()                                                                # slide
    optimizer.step()                                                               # slide
    return loss                                                                    # slide


@cstorch.step_closure                                                              # slide
def print_loss(loss: torch.Tensor):                                                # slide
    print(f"Loss: {loss.item()}")                                                  # slide
    losses.append(loss.item())


for inputs, targets in executor:                                                   # slide
    loss = training_step(inputs, targets)                                          # slide
    print_loss(loss)                                                               # slide

write_losses(OUT, losses)  # only the chief gets here: streamers exit 0 when the chief is done
