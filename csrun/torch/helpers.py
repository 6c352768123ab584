"""The small helpers of the user API: who am I, print once, meet, reduce.

=========================  ================================================================
``use_cs()``               True when the chief targets the device (embedded, remote, compile/validate only)
``is_master_ordinal()``    True on the chief (rank 0)
``is_streamer()``          True on every other rank
``get_ordinal()``          this task's rank among the chief and the streamers (a cluster's systems and MemoryX not counted)
``get_streaming_rank()``   the streaming rank (0-based among streamers); 0 on a lone chief,
                           -1 on a chief that has streamers
``num_streamers()``        streamers in the job (0 when the chief runs alone)
``task_id()``              for input code: the streaming rank (0 on any chief)
``num_tasks()``            for input code: the number of streamers (1 on a lone chief)
``master_print(*a)``       ``print`` on the chief only (flushed)
``rendezvous(tag)``        every task waits here until all arrive with the same tag
``mesh_reduce(tag, x, f)`` every task contributes ``x``; all get ``f([x_rank0, x_rank1, ...])``
=========================  ================================================================

``rendezvous`` and ``mesh_reduce`` are collective over every task of the job and must be
called before the Session (streamers leave at its end). On a lone chief, and on the chief
after its streaming Session ended, they involve the chief alone. Values travel through
:func:`csrun.stream.message.pack` (JSON, tensors, numpy arrays), never pickle. Neither
touches MPI in a single-task run.
"""

from __future__ import annotations

import zlib
from typing import Any, Callable

import numpy as np

from csrun.errors import UserError
from csrun.stream.message import pack, unpack
from csrun.stream.wire import mpi
from csrun.torch.process_state import input_comm, state
from csrun.torch.roles import ensure_assigned


class CollectiveError(UserError):
    """``rendezvous``/``mesh_reduce`` called where the tasks cannot all meet, or tags differ."""


def use_cs() -> bool:
    """True when the run targets the device (see the path table in :mod:`csrun.torch`)."""
    return state().options.uses_device


def is_master_ordinal(local: bool = False) -> bool:
    """True on the chief; ``local=True``: True on the first task of this node (as the legacy
    ``is_master_ordinal(local=...)``)."""
    info = state().info
    return info.local_rank == 0 if local else info.is_chief


def get_local_ordinal() -> int:
    """This task's rank among the tasks on its node."""
    return state().info.local_rank


def world_size() -> int:
    """Every task of the job (the chief and the streamers); ``xrt_world_size`` in the legacy module."""
    return state().info.input_tasks


def is_streamer() -> bool:
    """True on a streamer."""
    return not state().info.is_chief


def get_ordinal() -> int:
    """This task's rank among the tasks that run the script (0 is the chief, the streamers 1..S;
    on a cluster the systems and MemoryX are not counted), below :func:`world_size`."""
    return state().info.input_rank


def get_streaming_rank() -> int:
    """0-based rank among the streamers; 0 on a lone chief, -1 on a chief with streamers."""
    return state().info.streaming_rank


def num_streamers() -> int:
    """Streamers in the job (0 when the chief runs alone)."""
    return state().info.num_streamers


def task_id() -> int:
    """For input code: this task's shard index (the streaming rank; 0 on any chief)."""
    return max(state().info.streaming_rank, 0)


def num_tasks() -> int:
    """For input code: the number of shards (streamers; 1 on a lone chief)."""
    return max(state().info.num_streamers, 1)


def master_print(*args: Any, **kwargs: Any) -> None:
    """``print`` on the chief only."""
    if state().info.is_chief:
        kwargs.setdefault("flush", True)
        print(*args, **kwargs)


def _together() -> bool:
    st = state()
    if not st.streaming or st.streamed:
        return False
    if st.session is not None:
        raise CollectiveError("rendezvous/mesh_reduce inside a Session: the streamers are streaming "
                              "and cannot join; call it before the Session")
    ensure_assigned()  # csrun.torch.roles: 2.x streamers waiting for a role come to the collective
    return True


def _check_tags(tag: str, tags: np.ndarray, what: str) -> None:
    if len(set(tags.tolist())) > 1:
        mine = zlib.crc32(str(tag).encode())
        others = [r for r, t in enumerate(tags.tolist()) if t != mine]
        raise CollectiveError(f"{what}({tag!r}) on rank {get_ordinal()} met a different {what} tag "
                              f"on rank(s) {others}: every task must call the same {what} in the "
                              "same order")


def rendezvous(tag: str) -> None:
    """Wait until every task of the job reaches ``rendezvous`` with the same ``tag``."""
    if not _together():
        return
    world = input_comm()
    mine = np.array([zlib.crc32(str(tag).encode())], dtype=np.int64)
    tags = np.zeros(world.Get_size(), dtype=np.int64)
    world.Allgather(mine, tags)
    _check_tags(tag, tags, "rendezvous")


def mesh_reduce(tag: str, data: Any, reduce_fn: Callable[[list[Any]], Any]) -> Any:
    """Gather ``data`` from every task (rank order) and return ``reduce_fn`` of the list, on every task."""
    if not _together():
        return reduce_fn([data])
    world = input_comm()
    payload = np.frombuffer(pack(data), dtype=np.uint8)
    mine = np.array([zlib.crc32(str(tag).encode()), payload.size], dtype=np.int64)
    table = np.zeros((world.Get_size(), 2), dtype=np.int64)
    world.Allgather(mine, table)
    _check_tags(tag, table[:, 0], "mesh_reduce")
    sizes = table[:, 1]
    displs = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    everything = np.empty(int(sizes.sum()), dtype=np.uint8)
    world.Allgatherv(payload, [everything, sizes.tolist(), displs.tolist(), _byte()])
    values = [unpack(everything[d:d + s].tobytes()) for d, s in zip(displs.tolist(), sizes.tolist())]
    return reduce_fn(values)


def _byte() -> Any:
    """``MPI.BYTE``."""
    return mpi().BYTE
