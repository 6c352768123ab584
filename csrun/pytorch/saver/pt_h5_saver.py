"""``cstorch.saver.pt_h5_saver.PyTorchH5Saver``: the system's HDF5 checkpoint writer.

It can be named (the zoo's converters import it); building one raises one line: csrun reads and
writes its own ``.mdl`` checkpoints with ``cstorch.save`` / ``cstorch.load``.
"""

from __future__ import annotations

from csrun.torch.r1.unsupported import unsupported_class

PyTorchH5Saver = unsupported_class(
    "cerebras.pytorch.saver.pt_h5_saver.PyTorchH5Saver",
    "csrun's checkpoints are .mdl files: use cstorch.save / cstorch.load")

__all__ = ["PyTorchH5Saver"]
