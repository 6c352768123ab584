"""``cstorch.metrics``: eval metrics a model updates from inside its traced step.

A metric is called like a function from the model's ``forward`` (``self.accuracy(labels=...,
predictions=...)``). The call reads the step's values when they are ready: inside a
:class:`~csrun.pytorch.utils.data.DataExecutor` loop it queues the update as a step closure.
On the device its tensors are made inside the step's program, so the call taps them
(:mod:`csrun.driver.taps`): they become outputs of the program and the update runs on the
device's values of each step, as on the CPU. Outside a loop it updates at once. ``float(metric)`` (or :meth:`Metric.compute`) is the value over every
update since the last :meth:`Metric.reset`. Every metric built is listed, under its name, by
:func:`get_all_metrics` (a second metric of the same name gets ``_1``, ``_2``...).

=====================  ===========================================================================
:class:`AccuracyMetric`     ``(labels, predictions, weights=None)``: weighted share of equal elements
:class:`PerplexityMetric`   ``(labels, loss, weights=None)``: ``exp(sum(loss) / sum(weights))``
                            (``loss`` is the batch's summed token loss; no weights: every label counts)
:class:`MeanMetric`         ``(value, weight=None)``: the weighted mean of every value
:class:`FBetaScoreMetric`   ``(labels, predictions)``: F-beta over ``num_classes`` classes,
                            ``average_type`` ``"micro"`` or ``"macro"``, ``ignore_labels`` left out
=====================  ===========================================================================
"""

from __future__ import annotations

from typing import Any, Iterator

import torch

from csrun.driver import taps
from csrun.errors import UserError
from csrun.pytorch.utils.data import current_executor
from csrun.torch import add_step_closure


class MetricError(UserError):
    """A metric built or called with arguments it cannot use."""


_METRICS: dict[str, "Metric"] = {}


def _host(value: Any) -> torch.Tensor:
    """The value as a detached float64 CPU tensor."""
    return torch.as_tensor(value).detach().to("cpu", torch.float64)


class Metric:
    """The base of every metric (see the module manual)."""

    def __init__(self, name: str | None = None) -> None:
        base = name or type(self).__name__
        unique, n = base, 0
        while unique in _METRICS:
            n += 1
            unique = f"{base}_{n}"
        self.name = unique
        """The name :func:`get_all_metrics` lists it under."""
        _METRICS[unique] = self
        self.reset()

    def reset(self) -> None:
        """Forget every update."""
        raise NotImplementedError

    def update(self, *args: Any, **kwargs: Any) -> None:
        """Add one step's values (host tensors)."""
        raise NotImplementedError

    def compute(self) -> float:
        """The value over every update since the last reset."""
        raise NotImplementedError

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        if current_executor() is None:
            self.update(*args, **kwargs)
        elif not taps.tap(self.update, args, kwargs, queue=add_step_closure):  # not inside a device model call
            add_step_closure(self.update, args, kwargs)

    def __float__(self) -> float:
        return float(self.compute())

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def _weights(weights: Any, like: torch.Tensor) -> torch.Tensor:
    if weights is None:
        return torch.ones_like(like)
    w = _host(weights)
    if w.shape != like.shape:
        raise MetricError(f"metric weights of shape {tuple(w.shape)} do not match the labels' {tuple(like.shape)}")
    return w


class AccuracyMetric(Metric):
    """The weighted share of ``predictions`` equal to ``labels``."""

    def reset(self) -> None:
        self.total_correct = 0.0
        self.total_weight = 0.0

    def update(self, labels: Any, predictions: Any, weights: Any = None, dtype: Any = None) -> None:
        labels_h, predictions_h = _host(labels), _host(predictions)
        if labels_h.shape != predictions_h.shape:
            raise MetricError(f"AccuracyMetric: labels {tuple(labels_h.shape)} and predictions "
                              f"{tuple(predictions_h.shape)} differ in shape")
        w = _weights(weights, labels_h)
        self.total_correct += float(((labels_h == predictions_h).double() * w).sum())
        self.total_weight += float(w.sum())

    def compute(self) -> float:
        return self.total_correct / self.total_weight if self.total_weight else 0.0


class PerplexityMetric(Metric):
    """``exp`` of the summed token loss over the counted tokens."""

    def reset(self) -> None:
        self.total_loss = 0.0
        self.total_tokens = 0.0

    def update(self, labels: Any, loss: Any, weights: Any = None, dtype: Any = None) -> None:
        labels_h = _host(labels)
        self.total_loss += float(_host(loss).sum())
        self.total_tokens += float(_weights(weights, labels_h).sum())

    def compute(self) -> float:
        return float(torch.exp(torch.tensor(self.total_loss / self.total_tokens))) if self.total_tokens else 0.0


class MeanMetric(Metric):
    """The weighted mean of every value given."""

    def reset(self) -> None:
        self.total_value = 0.0
        self.total_weight = 0.0

    def update(self, value: Any, weight: Any = None, dtype: Any = None) -> None:
        v = _host(value)
        w = _weights(weight, v) if weight is not None else torch.ones_like(v)
        self.total_value += float((v * w).sum())
        self.total_weight += float(w.sum())

    def compute(self) -> float:
        return self.total_value / self.total_weight if self.total_weight else 0.0


class FBetaScoreMetric(Metric):
    """F-beta of class predictions (``average_type`` ``"micro"`` or ``"macro"``)."""

    def __init__(self, num_classes: int, beta: float = 1.0, average_type: str = "micro",
                 ignore_labels: list[int] | None = None, name: str | None = None) -> None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise MetricError(f"FBetaScoreMetric(num_classes={num_classes!r}): give 2 or more classes")
        if average_type not in ("micro", "macro"):
            raise MetricError(f"FBetaScoreMetric(average_type={average_type!r}): give 'micro' or 'macro'")
        if beta <= 0:
            raise MetricError(f"FBetaScoreMetric(beta={beta!r}): give a positive beta")
        self.num_classes, self.beta, self.average_type = num_classes, float(beta), average_type
        self.ignore_labels = list(ignore_labels or [])
        super().__init__(name)

    def reset(self) -> None:
        self.confusion = torch.zeros(self.num_classes, self.num_classes, dtype=torch.float64)

    def update(self, labels: Any, predictions: Any, dtype: Any = None) -> None:
        lab, pred = _host(labels).long().flatten(), _host(predictions).long().flatten()
        for bad in (lab, pred):
            if bad.numel() and (bad.min() < 0 or bad.max() >= self.num_classes):
                raise MetricError(f"FBetaScoreMetric: a class id outside 0..{self.num_classes - 1}")
        self.confusion += torch.bincount(lab * self.num_classes + pred,
                                         minlength=self.num_classes ** 2).reshape(self.num_classes, -1).double()

    def compute(self) -> float:
        keep = [c for c in range(self.num_classes) if c not in self.ignore_labels]
        tp = self.confusion.diagonal()[keep]
        predicted = self.confusion.sum(0)[keep]
        actual = self.confusion.sum(1)[keep]
        b2 = self.beta ** 2
        if self.average_type == "micro":
            tp, predicted, actual = tp.sum(), predicted.sum(), actual.sum()
        denom = (1 + b2) * tp + b2 * (actual - tp) + (predicted - tp)
        score = torch.where(denom > 0, (1 + b2) * tp / denom.clamp(min=1e-300), torch.zeros_like(denom))
        return float(score.mean())


def get_all_metrics() -> Iterator[tuple[str, Metric]]:
    """Every metric built in this process, as ``(name, metric)``."""
    yield from list(_METRICS.items())


def reset_for_tests() -> None:
    """Forget every metric (unit tests only)."""
    _METRICS.clear()


__all__ = ["Metric", "MetricError", "AccuracyMetric", "PerplexityMetric", "MeanMetric", "FBetaScoreMetric",
           "get_all_metrics"]
