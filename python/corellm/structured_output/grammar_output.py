"""GrammarOutput: the step's grammar bitmasks, from the StructuredOutputManager to the model
runner's sampler (seed 003: sample_tokens(grammar_output) -> apply_grammar_bitmask)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class GrammarOutput:
    # int32 [num_structured, ceil(vocab / 32)]: the tokens each structured row's grammar allows now
    # (bit t % 32 of word t / 32), one row per structured request that samples this step.
    bitmask: np.ndarray
    # int32 [num_reqs], in the SchedulerOutput's order: the request's row in bitmask, or -1.
    bitmask_rows: np.ndarray
