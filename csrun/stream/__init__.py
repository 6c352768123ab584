"""Streaming input batches from the streamers to the chief over MPI, without pickle.

How it works: each streamer first receives START (how many batches to skip so that the run
starts at a given global batch), loads its first batch and sends HELLO with the batch's
schema as JSON (nested dict/tuple/list structure, dtypes, shapes, wire dtypes: int64 travels
as int32) plus its rank and node. The chief checks that every streamer describes the same
batch, posts a ring of ``prefetch`` receives per streamer (one ``Irecv`` per leaf, into
buffers it owns) and grants credit: a streamer sends a batch only when the chief has
already posted its receive, so memory stays bounded on both sides. Batches then travel as
raw buffers (``Isend``/``Irecv`` of uint8 views of the tensors' memory); each consumed slot
is re-posted and credited again. The chief takes batches round-robin over the streamers, so
the sequence it sees depends on the data alone; epoch ends, errors and the stop handshake
are small fixed-size int64 control headers on their own tags (see :mod:`csrun.stream.wire`).

What a waiting task costs: no wait calls MPICH's blocking ``Recv``/``Wait`` (its progress
engine spins inside them); every wait polls with ``Test`` and sleeps between polls
(:class:`~csrun.stream.wire.Backoff`). A streamer waiting for credit costs a small share of a core,
more when credit comes often (the README's main job) than when it comes seldom
(``bench/stream/idle_cpu.py``; figures in BENCHMARKS.md): the cost is its polls. The
chief waiting for a batch polls flat out for 2 ms, then sleeps up to 0.5 ms, so a ready batch
is seen at once and a late one within 0.5 ms. Before ``MPI_Init`` (whose wait for the other
tasks on the node spins in MPICH) a task sleeps on the node's arrival board until they have
all come (:mod:`~csrun.stream.arrivals`): a streamer waiting there for a chief still building
its model costs next to nothing instead of the core MPICH's spin takes (``bench/stream/mpi_init.py``; BENCHMARKS.md).

Modules: :mod:`~csrun.stream.schema` (structure and buffers), :mod:`~csrun.stream.wire`
(tags, headers, timeouts), :mod:`~csrun.stream.source` (what a streamer streams),
:mod:`~csrun.stream.sender` (streamer side), :mod:`~csrun.stream.receiver` (chief side),
:mod:`~csrun.stream.local` (a lone chief), :mod:`~csrun.stream.stats` (figures and the
input-bound verdict), :mod:`~csrun.stream.arrivals` (the board before ``MPI_Init``),
:mod:`~csrun.stream.errors`. This package never imports
``csrun.torch``; it uses ``MPI.COMM_WORLD`` and reserves tags 11-14 on it.
"""
