"""Dynamic loss scaling's defaults, written once: the params, the program spec, the engine's
scaler and ``cbtorch.amp.GradScaler`` all read them from here.

``INITIAL_LOSS_SCALE`` (2**15) the first scale; ``STEPS_PER_INCREASE`` (2000) overflow-free steps
before it doubles; ``MIN_LOSS_SCALE`` (1) and ``MAX_LOSS_SCALE`` (2**24) its bounds. An overflow
halves the scale and skips the step.
"""

INITIAL_LOSS_SCALE = 2.0 ** 15
STEPS_PER_INCREASE = 2000
MIN_LOSS_SCALE = 1.0
MAX_LOSS_SCALE = 2.0 ** 24
