"""A loader that refills one set of tensors in place (a ``collate_fn`` writing into preallocated
buffers). Through torch's in-place operations it is refused on the lone chief, with the message a
streamer gives (a streamer sends from those tensors while the next batch loads). Through a numpy
view, which no version counter sees, the lone chief still trains as eager: each batch the loop gets
is the chief's own copy, as a streamed batch lands in the chief's receive buffers, so neither the
device (which runs a step while the loop fetches the next batch) nor a step closure (which runs
after that fetch) sees the next batch's values."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import csrun.torch as cbtorch
from csrun.stream.errors import BatchError
from tests.tiny_models import MLP

from .helpers import settings

pytestmark = pytest.mark.timeout(120)

BATCH, STEPS, WIDTH = 256, 6, 784


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(BATCH * STEPS, WIDTH, generator=g),
                         torch.randint(0, 10, (BATCH * STEPS,), generator=g))


def _refilling_loader(through_numpy: bool) -> DataLoader:
    x, y = torch.empty(BATCH, WIDTH), torch.empty(BATCH, dtype=torch.int64)

    def collate(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
        if through_numpy:  # writes no version counter sees
            x.numpy()[:] = torch.stack([s[0] for s in samples]).numpy()
            y.numpy()[:] = torch.stack([s[1] for s in samples]).numpy()
        else:
            torch.stack([s[0] for s in samples], out=x)
            torch.stack([s[1] for s in samples], out=y)
        return x, y

    return DataLoader(_data(), batch_size=BATCH, collate_fn=collate, drop_last=True)


def _train(cs_ip: str | None, model_dir: str, *, through_numpy: bool = True) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Weights after STEPS steps, and the labels each step's closure saw."""
    cbtorch.initialize(cs_ip, settings=settings(), model_dir=model_dir)
    torch.manual_seed(0)
    model = cbtorch.module(MLP(WIDTH, 256, 10, activation="relu"))
    opt = cbtorch.optimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    loader = cbtorch.dataloader(_refilling_loader(through_numpy))
    seen: list[torch.Tensor] = []
    with cbtorch.Session(loader, report=False):
        for batch in loader:
            opt.zero_grad()
            loss = model(batch)
            loss.backward()
            opt.step()
            cbtorch.add_step_closure(lambda labels: seen.append(labels.clone()), (batch[1],))
    return [t.detach().clone() for t in model.state_dict().values()], seen


@pytest.mark.parametrize("cs_ip", [None, "embedded"])
def test_a_refill_by_torch_in_place_ops_is_refused_naming_the_leaf(cs_ip: Any, model_dir: str) -> None:
    with pytest.raises(BatchError, match=r"wrote into the tensor at \[0\] of a batch it had already handed over"):
        _train(cs_ip, model_dir, through_numpy=False)


@pytest.mark.parametrize("cs_ip", [None, "embedded"])
def test_a_step_closure_sees_its_own_batch(cs_ip: Any, model_dir: str) -> None:
    _, seen = _train(cs_ip, model_dir)
    labels = _data().tensors[1]
    assert len(seen) == STEPS
    for step, got in enumerate(seen):
        assert torch.equal(got, labels[step * BATCH:(step + 1) * BATCH]), f"step {step} saw another batch's labels"


def test_the_device_trains_as_eager_on_refilled_batches(model_dir: str) -> None:
    eager, _ = _train(None, model_dir + "-cpu")
    device, _ = _train("embedded", model_dir)
    assert all(torch.equal(a, b) for a, b in zip(eager, device))
