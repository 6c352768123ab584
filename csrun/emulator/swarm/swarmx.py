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
        self._specs: dict[tuple[int, int], tuple[torch.Tensor, list[Any]]] = {}

    def broadcast(self, vector: torch.Tensor) -> None:
        """MemoryX's ``vector`` into every system's (same length, float32, contiguous on the CPU)."""
        self.comm.Bcast(self._spec(vector), root=self.memoryx)

    def reduce(self, vector: torch.Tensor, into: torch.Tensor | None = None) -> None:
        """Sum every system's ``vector`` into MemoryX's ``into`` (MemoryX contributes ``vector``,
        its zeros; ``into`` only on MemoryX)."""
        recv = self._spec(into) if into is not None and self.is_memoryx else None
        self.comm.Reduce(self._spec(vector), recv, op=self._mpi.SUM, root=self.memoryx)

    def _spec(self, vector: torch.Tensor) -> list[Any]:
        """mpi4py's ``[buffer, MPI.FLOAT]`` for ``vector``, made once per buffer (the roles reuse theirs)."""
        key = (vector.data_ptr(), vector.numel())
        made = self._specs.get(key)
        if made is None or made[0] is not vector:
            if vector.dtype != torch.float32 or vector.device.type != "cpu" or not vector.is_contiguous():
                raise ValueError("SwarmX moves contiguous float32 vectors on the CPU")
            made = self._specs[key] = (vector, [vector.numpy(), self._mpi.FLOAT])
        return made[1]
