"""Input functions for models whose data is HDF5 written by ``cs_convert_hdf5``.

:func:`hdf5_input_fns` turns a model's input-config class and its mapping to
:class:`~csrun.data.HDF5InputConfig` into the runner's ``train_input_fn`` and
``eval_input_fn``: each reads its section of the params, checks the model's ``vocab_size``
against the data, and returns this streamer's shard (``cbtorch.task_id()`` of
``cbtorch.num_tasks()``; 0 of 1 on a lone chief).
"""

from __future__ import annotations

from typing import Any, Callable

from torch.utils.data import DataLoader

from csrun.data import HDF5InputConfig, hdf5_dataloader
from csrun.run.params import InputConfig
from csrun.typed_config import ConfigError

InputFn = Callable[[Any], DataLoader]


def hdf5_input_fns(
    config_type: type[InputConfig],
    to_hdf5: Callable[..., HDF5InputConfig],
    model_name: str,
) -> tuple[InputFn, InputFn]:
    """``(train_input_fn, eval_input_fn)`` for sections of ``config_type``.

    ``to_hdf5(cfg, vocab_size=...)`` maps a section to the HDF5 reader's config;
    ``model_name`` appears in the error for a section of another type.
    """

    def section_loader(section: str) -> InputFn:
        def input_fn(params: Any) -> DataLoader:
            cfg = getattr(params, section)
            if not isinstance(cfg, config_type):
                raise ConfigError(f"{section}: needs a {model_name} input section, got {type(cfg).__name__}")
            import csrun.torch as cbtorch  # here: building an input config needs no torch API

            return hdf5_dataloader(to_hdf5(cfg, vocab_size=getattr(params.model, "vocab_size", None)),
                                   shard_index=cbtorch.task_id(), num_shards=cbtorch.num_tasks())

        input_fn.__doc__ = f"The runner's input function: this streamer's shard of ``params.{section}``."
        return input_fn

    return section_loader("train_input"), section_loader("eval_input")
