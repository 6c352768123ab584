"""SwarmX on MPI: the weights broadcast from MemoryX to the systems, their gradients summed back.

One float32 vector each way per step, through MPI's own collectives on the swarm's communicator
(``Bcast`` from MemoryX's rank, ``Reduce`` with ``SUM`` into it): no reduction of csrun's own.
"""

from __future__ import annotations

from typing import Any

import torch


class SwarmX:
    """The swarm's two collectives on ``comm`` (an mpi4py communicator), MemoryX being rank ``memoryx``."""

    def __init__(self, comm: Any, memoryx: int = 0) -> None:
        from mpi4py import MPI

        self._mpi = MPI
        self.comm = comm
        self.memoryx = memoryx
        self.is_memoryx = comm.Get_rank() == memoryx
        self.systems = comm.Get_size() - 1
        """N: the swarm's ranks other than MemoryX."""

    def broadcast(self, vector: torch.Tensor) -> None:
        """MemoryX's ``vector`` into every system's (same length, float32, contiguous on the CPU)."""
        self.comm.Bcast([_buffer(vector), self._mpi.FLOAT], root=self.memoryx)

    def reduce(self, vector: torch.Tensor, into: torch.Tensor | None = None) -> None:
        """Sum every system's ``vector`` into MemoryX's ``into`` (MemoryX contributes ``vector``,
        its zeros; ``into`` only on MemoryX)."""
        recv = [_buffer(into), self._mpi.FLOAT] if into is not None and self.is_memoryx else None
        self.comm.Reduce([_buffer(vector), self._mpi.FLOAT], recv, op=self._mpi.SUM, root=self.memoryx)


def _buffer(vector: torch.Tensor | None) -> Any:
    if vector is None or vector.dtype != torch.float32 or vector.device.type != "cpu" or not vector.is_contiguous():
        raise ValueError("SwarmX moves contiguous float32 vectors on the CPU")
    return vector.numpy()
