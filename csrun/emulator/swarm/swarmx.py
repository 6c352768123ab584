"""SwarmX on MPI: the weights broadcast from MemoryX to the systems, their gradients summed back.

One float32 vector each way per step, through MPI's own collectives on the swarm's communicator
(``Bcast`` from MemoryX's rank, ``Reduce`` with ``SUM`` into it): no reduction of csrun's own.
Each is started non-blocking (``Ibcast`` / ``Ireduce``) and waited for at
:class:`~csrun.stream.wire.Backoff`'s pace: MemoryX waits in the reduction while the systems
run their forward and backward, and MPICH's blocking collectives would spin a core doing it.
"""

from __future__ import annotations

from typing import Any

import torch

from csrun.stream.wire import Backoff, wait_for


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
        self._wait(self.comm.Ibcast(self._spec(vector), root=self.memoryx))

    def reduce(self, vector: torch.Tensor) -> None:
        """Sum every system's ``vector`` into MemoryX's: on MemoryX ``vector`` is where the sum lands
        (in place: its contents are dropped first, MemoryX adding nothing of its own)."""
        if self.is_memoryx:
            vector.zero_()
            self._wait(self.comm.Ireduce(self._mpi.IN_PLACE, self._spec(vector), op=self._mpi.SUM, root=self.memoryx))
        else:
            self._wait(self.comm.Ireduce(self._spec(vector), None, op=self._mpi.SUM, root=self.memoryx))

    @staticmethod
    def _wait(request: Any) -> None:
        """Until ``request`` completes, polled at a collective's pace (no spinning once it idles)."""
        wait_for(request.Test, Backoff.collective())

    def _spec(self, vector: torch.Tensor) -> list[Any]:
        """mpi4py's ``[buffer, MPI.FLOAT]`` for ``vector``, made once per buffer (the roles reuse theirs)."""
        key = (vector.data_ptr(), vector.numel())
        made = self._specs.get(key)
        if made is None or made[0] is not vector:
            if vector.dtype != torch.float32 or vector.device.type != "cpu" or not vector.is_contiguous():
                raise ValueError("SwarmX moves contiguous float32 vectors on the CPU")
            made = self._specs[key] = (vector, [vector.numpy(), self._mpi.FLOAT])
        return made[1]
