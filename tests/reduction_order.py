"""How far N systems' training may drift from one system at N·B: reduction-order rounding, no more.

A cluster of N systems sums N shards' mean gradients (MPI Reduce) and divides by N; one system
takes the mean over the N·B samples at once. Both add the same float32 numbers in another order,
so each step's gradient differs by a few units in the last place (float32 eps: 1.2e-7). Over 100
steps momentum and AdamW carry that forward, AdamW the most: its update m / sqrt(v) gives a
gradient near zero, where the rounding is as large as the gradient itself, a step of full size.

Measured on tests/emulator/scripts/swarm_job.py's training (100 steps, clipping, dynamic loss
scaling) against one engine at N·B, with nothing changed but the order of the samples within each
step (a rounding difference and nothing else), the final weights moved by up to 5e-7 (SGD with
momentum) and 1.7e-6 (AdamW, 3 systems) relative to the largest weight; another CPU's kernels add
in another order, so the figure moves with the machine (2e-6 on one CI machine, over the 1e-6 these
tests once used). A semantic error moves them by far more, the smallest tried by 7e-4: one sample
of one step of the 100 changed, 3e-2 (SGD) to 1e-1 (AdamW); one system's shard replaced in one
step, 7e-2 to 2.5e-1; one step's batch repeated, 1e-1 to 4e-1; the learning rate 0.1 % off,
7e-4 to 1e-2 (issue 45 item 9).

:data:`ROUNDING_BOUND` sits between: about 60 times the largest rounding drift measured (some 800
float32 eps), 7 times under the smallest semantic error tried.
"""

ROUNDING_BOUND = 1e-4
"""Largest relative difference (losses, final weights) a reduction order's rounding may cause."""
