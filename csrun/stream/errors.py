"""Errors of the streaming protocol.

:class:`StreamError` means the job's input stream broke (a streamer failed, died or went
silent); the chief raises it, prints it and ends the whole job. :class:`BatchError` means a
batch the system could not have streamed (a non-tensor leaf, a shape that changed, an int64
value that does not fit int32); the user fixes the input pipeline.
"""

from __future__ import annotations

from csrun.errors import UserError


class StreamError(UserError):
    """The input stream broke: a streamer raised, died, or sent nothing within the timeout."""

    exit_code = 1


class BatchError(UserError):
    """A batch that cannot be streamed: unsupported leaf, changed shape or dtype, lossy int64."""

    exit_code = 1
