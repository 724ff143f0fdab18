"""Whether corellm computes what transformers computes, on the same weights in fp32: over the
positions scored, the largest logit difference, and how often the top token differs where
transformers' top-2 margin is clear (a near-tie is no oracle for either's order)."""

from __future__ import annotations

from dataclasses import dataclass

CLEAR_MARGIN = 0.25  # between transformers' top two logits


@dataclass
class LogitAgreement:
    worst: float = 0.0  # the largest logit difference
    differ: int = 0  # clear positions where corellm's top token is not transformers'
    clear: int = 0  # positions where transformers' top-2 margin exceeds CLEAR_MARGIN

    def add(self, got, want) -> "LogitAgreement":
        """got, want: float32 logits [positions, vocab] of corellm and transformers."""
        import torch

        self.worst = max(self.worst, float((got - want).abs().max()))
        top2 = torch.topk(want, 2).values
        clear = (top2[:, 0] - top2[:, 1]) > CLEAR_MARGIN
        self.differ += int(((got.argmax(-1) != want.argmax(-1)) & clear).sum())
        self.clear += int(clear.sum())
        return self

    def __str__(self) -> str:
        return (f"the largest logit difference {self.worst:.1e}; the top token differs at {self.differ} of "
                f"{self.clear} positions where transformers' top-2 margin exceeds {CLEAR_MARGIN}")


def decode_agreement(ours, hf, vocab_size: int, lengths: tuple[int, ...], seed: int = 0) -> LogitAgreement:
    """corellm's model `ours` (a LlamaForCausalLM, decoding one token a step through the paged
    cache: tests/model/runner.py) against the transformers model `hf` (the whole prompt at once) on
    random prompts of `lengths`, every position's logits."""
    import sys
    from pathlib import Path

    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/model/runner.py
    from tests.model.runner import PagedRunner

    g = torch.Generator().manual_seed(seed)
    agreement = LogitAgreement()
    for length in lengths:
        ids = torch.randint(100, vocab_size, (length,), generator=g).tolist()
        runner = PagedRunner(ours, length, 1)
        got = torch.cat([runner.step([[t]]) for t in ids])  # every position's logits, decode by decode
        with torch.no_grad():
            agreement.add(got, hf(torch.tensor([ids])).logits[0])
    return agreement
