"""``cstorch.saver``: the system's HDF5 checkpoint format (:mod:`.pt_h5_saver`).

csrun's checkpoints are ``.mdl`` files read weights-only (``cstorch.save`` / ``cstorch.load``).
"""

from csrun.pytorch.saver.pt_h5_saver import PyTorchH5Saver

__all__ = ["PyTorchH5Saver"]
