"""``cerebras.appliance.environment``: ``appliance_environ``, the environment the input workers see.

On the system it was a mapping copied to the appliance's worker processes. csrun's streamer
tasks are the job's own processes, started with the job's environment, so it is
``os.environ`` itself: a value set through it is seen by every task started afterwards and by
this process.
"""

from __future__ import annotations

import os

appliance_environ = os.environ
"""The job's environment (``os.environ``)."""

__all__ = ["appliance_environ"]
