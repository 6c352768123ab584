"""Every legacy learning_rate form against values computed by hand."""

from __future__ import annotations

import math

import pytest

from csrun.program.errors import SpecError
from csrun.program.schedules import build_schedule

CASES = [
    (0.1, {0: 0.1, 1000: 0.1}),
    ("1e-4", {0: 1e-4, 7: 1e-4}),
    ({"scheduler": "Constant", "learning_rate": 0.5, "steps": 10}, {0: 0.5, 99: 0.5}),
    ({"scheduler": "Exponential", "initial_learning_rate": 1.0, "decay_steps": 10, "decay_rate": 0.5},
     {0: 1.0, 5: math.sqrt(0.5), 20: 0.25}),
    ({"scheduler": "exponential", "initial_learning_rate": 1.0, "decay_steps": 10, "decay_rate": 0.5,
      "staircase": True}, {9: 1.0, 15: 0.5, 20: 0.25}),
    ({"scheduler": "PiecewiseConstant", "values": [1.0, 0.5, 0.1], "boundaries": [10, 20]},
     {0: 1.0, 9: 1.0, 10: 0.5, 19: 0.5, 20: 0.1, 500: 0.1}),
    ({"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 1e-4, "steps": 10000},
     {0: 0.0, 5000: 5e-5, 10000: 1e-4, 20000: 1e-4}),
    ({"scheduler": "Polynomial", "initial_learning_rate": 1.0, "end_learning_rate": 0.0, "steps": 10, "power": 2},
     {0: 1.0, 5: 0.25, 10: 0.0, 30: 0.0}),
    ({"scheduler": "Polynomial", "initial_learning_rate": 1.0, "end_learning_rate": 0.0, "decay_steps": 10,
      "power": 2, "cycle": True}, {0: 1.0, 5: 0.25, 15: 0.0625, 20: 0.0}),
    ({"scheduler": "InverseExponentialTimeDecay", "initial_learning_rate": 1.0, "decay_steps": 10,
      "decay_rate": 0.5, "step_exponent": 2}, {0: 1.0, 10: 1 / 6, 5: 1 / 2.25}),
    ({"scheduler": "InverseExponentialTimeDecay", "initial_learning_rate": 1.0, "decay_steps": 10,
      "decay_rate": 0.5, "step_exponent": 2, "staircase": True}, {5: 0.5, 3: 1.0}),
    ({"scheduler": "CosineDecay", "initial_learning_rate": 1.0, "end_learning_rate": 0.1, "decay_steps": 100},
     {0: 1.0, 50: 0.55, 100: 0.1, 200: 0.1}),
    ({"scheduler": "CosineAnnealing", "learning_rate": 1.0, "t_max": 10, "eta_min": 0.0},
     {0: 1.0, 5: 0.5, 10: 0.0, 20: 1.0}),
    ({"scheduler": "Step", "learning_rate": 1.0, "step_size": 3, "gamma": 0.1}, {2: 1.0, 3: 0.1, 6: 0.01}),
    ({"scheduler": "MultiStep", "learning_rate": 1.0, "gamma": 0.5, "milestones": [2, 5]},
     {1: 1.0, 2: 0.5, 4: 0.5, 5: 0.25, 100: 0.25}),
    # the BERT reference: warm up 0 -> 1e-4 over 10 steps, then 1e-4 -> 0 over 100
    ([{"scheduler": "Linear", "initial_learning_rate": 0.0, "end_learning_rate": 1e-4, "steps": 10},
      {"scheduler": "Linear", "initial_learning_rate": 1e-4, "end_learning_rate": 0.0, "steps": 100}],
     {0: 0.0, 5: 5e-5, 10: 1e-4, 60: 5e-5, 110: 0.0, 500: 0.0}),
    ([{"scheduler": "Constant", "learning_rate": 0.3, "steps": 4},
      {"scheduler": "Exponential", "initial_learning_rate": 0.2, "decay_steps": 2, "decay_rate": 0.5},
      {"scheduler": "Constant", "learning_rate": 0.01}],
     {3: 0.3, 4: 0.2, 5: 0.2 * math.sqrt(0.5), 6: 0.01}),
]


@pytest.mark.parametrize("form,expected", CASES, ids=[str(i) for i in range(len(CASES))])
def test_schedule_values(form: object, expected: dict[int, float]) -> None:
    sched = build_schedule(form)
    for step, value in expected.items():
        assert sched(step) == pytest.approx(value, rel=1e-12, abs=1e-15), (step, sched(step), value)


@pytest.mark.parametrize("form,needle", [
    ({"scheduler": "Cosine", "learning_rate": 1.0}, "valid choices: Constant, Exponential"),
    ({"scheduler": "Exponential", "initial_learning_rate": 1.0, "decay_rate": 0.5}, "decay_steps"),
    ({"scheduler": "Step", "learning_rate": 1.0, "step_size": 3, "gamma": 0.1, "gama": 2}, "gama"),
    ([{"scheduler": "Constant", "learning_rate": 1.0}, {"scheduler": "Constant", "learning_rate": 2.0}],
     "needs 'steps' or 'decay_steps'"),
    ({"scheduler": "PiecewiseConstant", "values": [1.0], "boundaries": [3]}, "one more value"),
    ({"learning_rate": 1.0}, "'scheduler' key"),
    ("fast", "not a number"),
    (True, "must be a number"),
    ({"scheduler": "Linear", "initial_learning_rate": "x", "end_learning_rate": 0, "steps": 3}, "must be a number"),
])
def test_bad_forms_name_the_key(form: object, needle: str) -> None:
    with pytest.raises(SpecError, match="learning_rate") as info:
        build_schedule(form)
    assert needle in str(info.value)
