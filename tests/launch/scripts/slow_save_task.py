"""A three-task job whose "checkpoint at the next step" takes minutes (tests/launch/test_ctrl_c.py).

After a first Ctrl-C (the preemption signal, ``CSRUN_PREEMPT_SIGNAL``, at every task) only a
second can end it soon: the test of "a second Ctrl-C stops at once" needs a job still busy
saving when that press comes, which a real fc_mnist, done in milliseconds, is not. Every task
prints ``rank N ready`` once its handler is in place, then ``rank N saving`` when the signal
came. The arguments are not read (a test names its tmp_path there, to find leftovers by).
"""

import os
import signal
import time

from csrun.launch.preempt_signal import preemption_signal

rank = int(os.environ.get("PMI_RANK", os.environ.get("SLURM_PROCID", "0")))
asked: list[int] = []
signal.signal(preemption_signal(), lambda signum, _frame: asked.append(signum))
print(f"rank {rank} ready", flush=True)
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    if asked:
        print(f"rank {rank} saving", flush=True)
        time.sleep(max(0.0, deadline - time.monotonic()))  # a checkpoint that takes the rest of the time
        break
    time.sleep(0.05)
