"""``with cbtorch.Session(dataloader, mode="train"):`` — where the run happens.

On a **streamer**, entering the session streams this task's shard to the chief, epoch after
epoch, until the chief says stop; then the process leaves with exit status 0
(``sys.exit(0)``, after MPI is finalized): the body never runs on a streamer and neither
does anything after it in the script.

On the **chief**, entering starts the stream (the receive ring, see
:mod:`csrun.stream.receiver`) and the backend's session; iterating the dataloader in the
body yields the batches. Leaving runs the last step's closures, stops the streamers,
collects their statistics into :attr:`Session.stats` (a
:class:`~csrun.stream.stats.StreamStats`, for ``performance.json``) and prints the input
table with the input-bound verdict on stderr. Only one session per run can stream: the
streamers are gone after it.

While a session runs, the objects alive at its entry are frozen out of the garbage
collector's scans and given back at its exit (:mod:`csrun.torch.gc_policy`).

Failures end the whole job, never hang it: a :class:`~csrun.stream.errors.StreamError`
(a streamer failed, died or went silent) is printed as ``csrun: error: ...`` and the job is
aborted (``MPI.COMM_WORLD.Abort(1)``). Any other exception in the chief's body stops the
streamers (bounded wait) and propagates; if they cannot be stopped the job is aborted.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any, Literal, NoReturn

from csrun.errors import UserError
from csrun.stream.errors import StreamError
from csrun.stream.receiver import Receiver
from csrun.stream.stats import StreamerStats, StreamStats, print_report
from csrun.stream.wire import abort_after_output, error_grace, stream_timeout
from csrun.torch.closures import add_step_closure, end_step
from csrun.torch.dataloader import StreamingDataLoader
from csrun.torch.gc_policy import hold_setup_objects, release_setup_objects
from csrun.torch.process_state import comm, state, stream_and_exit
from csrun.torch.roles import ensure_assigned

MODES = ("train", "eval")

_STOP_AFTER_FAILURE_S = 10.0


class SessionError(UserError):
    """A Session used in a way the system did not allow."""


def abort_job(message: str) -> NoReturn:
    """Print ``csrun: error: message`` on stderr and abort every task of the job (exit status 1)."""
    sys.stdout.flush()
    sys.stderr.write(f"csrun: error: {message}\n")
    abort_after_output(comm(), message)
    raise SystemExit(1)  # MPI_Abort does not return; should it, this task still ends


class Session:
    """The run's context: streams on streamers, trains or evaluates on the chief."""

    def __init__(self, dataloader: StreamingDataLoader, mode: str = "train", *, report: bool = True) -> None:
        if not isinstance(dataloader, StreamingDataLoader):
            raise SessionError(f"Session needs the loader returned by cbtorch.dataloader(), got "
                               f"{type(dataloader).__name__}: wrap it with cbtorch.dataloader(loader)")
        if mode not in MODES:
            raise SessionError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.dataloader = dataloader
        self.mode = mode
        self.report = report
        """Print the input table when the session ends."""
        self.stats: StreamStats | None = None
        """The input stream's figures, set when the session ends."""
        self._receiver: Receiver | None = None
        self._held_heap = False

    def __enter__(self) -> "Session":
        st = state()
        if not st.info.is_chief:
            stream_and_exit(self.dataloader.source())
        if st.session is not None:
            raise SessionError("sessions do not nest: leave the current Session first")
        if st.streaming and st.streamed:
            raise SessionError("only one Session per run can stream: the streamers exit when the "
                               "first one ends")
        if st.streaming:
            stream_timeout(), error_grace()  # a bad setting fails here, while the streamers can still be released
            ensure_assigned()  # csrun.torch.roles: 2.x streamers still waiting run the script
        self._held_heap = hold_setup_objects()  # csrun.torch.gc_policy: the setup's heap is not scanned again
        try:
            st.backend.begin_session(self.mode, self.dataloader.loader)
        except BaseException:
            release_setup_objects(self._held_heap)
            raise
        if st.streaming:
            st.streamed = True
            try:
                receiver = Receiver(comm(), st.info.streamer_ranks,
                                    prefetch=self.dataloader.prefetch, skip=self.dataloader.start_batch)
                receiver.start()
            except StreamError as exc:
                abort_job(str(exc))
            except Exception as exc:  # noqa: BLE001 - the streamers wait for START: end the whole job
                abort_job(f"the session could not start streaming: {type(exc).__name__}: {exc}")
            self._receiver = receiver
            print(f"csrun: streaming from {st.info.num_streamers} streamer(s): {receiver.describe()}",
                  flush=True)  # the run's story is on stdout
            self.dataloader.attach(receiver)
        st.session = self
        return self

    def add_step_closure(self, fn: Any, args: tuple = (), kwargs: dict[str, Any] | None = None,
                         run_async: bool = False) -> None:
        """The legacy ``session.add_step_closure``: as :func:`csrun.torch.add_step_closure`."""
        add_step_closure(fn, args, kwargs, run_async)

    def mark_step(self) -> None:
        """The legacy ``session.mark_step``: end the current step now (see ``cb_model.mark_step``)."""
        end_step()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> Literal[False]:
        try:
            return self._leave(exc)
        finally:
            release_setup_objects(self._held_heap)
            self._held_heap = False

    def _leave(self, exc: BaseException | None) -> Literal[False]:
        st = state()
        st.session = None
        receiver = self._receiver
        streaming = receiver is not None
        if isinstance(exc, StreamError) and streaming:
            abort_job(str(exc))
        if exc is not None and receiver is not None:
            receiver.timeout = min(receiver.timeout, _STOP_AFTER_FAILURE_S)
        streamers: list[StreamerStats] = []
        try:
            streamers = self.dataloader.finish(run_closures=exc is None)
        except StreamError as stop_exc:
            if not streaming:
                raise
            if exc is not None:
                traceback.print_exception(exc)
            abort_job(str(stop_exc))
        st.backend.end_session(exc is not None)
        self.stats = StreamStats(chief=self.dataloader.stats, streamers=streamers)
        if exc is None and self.report:
            print_report(self.stats)
        return False
