"""StepCostModel recovers a step's fixed and per-token cost from noisy step times, and declines to
guess while every step has the same size."""

from __future__ import annotations

import random

import pytest

from corellm.engine.step_cost_model import StepCostModel


def test_fits_fixed_and_per_token_cost() -> None:
    rng = random.Random(0)
    model = StepCostModel()
    for _ in range(400):
        tokens = rng.randint(16, 80)
        model.observe(tokens, 0.014 + 0.0007 * tokens + rng.gauss(0, 0.001))
    fixed, per_token = model.estimate()
    assert fixed == pytest.approx(0.014, abs=0.002)
    assert per_token == pytest.approx(0.0007, abs=0.0001)


def test_no_estimate_from_steps_of_one_size_and_recent_steps_weigh_more() -> None:
    model = StepCostModel()
    for _ in range(50):
        model.observe(16, 0.02)
    assert model.estimate() is None
    for i in range(300):  # the machine got slower per token: the fit follows
        model.observe(16 + i % 32, 0.01 + 0.002 * (16 + i % 32))
    assert model.estimate()[1] == pytest.approx(0.002, rel=0.05)
    for _ in range(10):
        model.observe(20, 0.001)  # cannot make the per-token cost negative
    assert model.estimate()[1] >= 0.0
