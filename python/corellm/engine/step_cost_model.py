"""StepCostModel: what a decoding step costs on this machine, fitted as it runs: time = fixed +
per_token * tokens, by least squares over recent steps, older ones weighing less (a decay per
step). Speculative decoding asks it whether one more token in a step is worth a draft's chance of
acceptance (Scheduler.set_step_cost): on a GPU, or on a CPU at batch 1, a step's time barely grows
with its tokens and drafts are nearly free; on a CPU with many requests running, each token costs
about as much as an output token, and only drafts that are almost sure to pass pay."""

from __future__ import annotations


class StepCostModel:
    def __init__(self, decay: float = 0.98, min_token_spread: float = 1.0):
        self.decay = decay
        self.min_token_spread = min_token_spread  # a fit needs steps of different sizes
        self._w = self._x = self._y = self._xx = self._xy = 0.0

    def observe(self, num_tokens: int, seconds: float) -> None:
        d = self.decay
        x, y = float(num_tokens), float(seconds)
        self._w = self._w * d + 1.0
        self._x = self._x * d + x
        self._y = self._y * d + y
        self._xx = self._xx * d + x * x
        self._xy = self._xy * d + x * y

    def estimate(self) -> tuple[float, float] | None:
        """(fixed seconds, seconds per token), or None while the steps seen are too alike to tell."""
        if self._w < 4.0:
            return None
        mx, my = self._x / self._w, self._y / self._w
        var = self._xx / self._w - mx * mx
        if var < self.min_token_spread ** 2:
            return None
        per_token = max(0.0, (self._xy / self._w - mx * my) / var)
        fixed = max(my - per_token * mx, 1e-6)
        return fixed, per_token
