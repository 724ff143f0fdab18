"""The scheduler's image path through the Python binding (seed 000's encoder budget and encoder
cache manager): which images each step encodes, how a step's tokens stop short of an image the
encoder cannot take yet, sharing and freeing of encoder outputs, preemption, and bad input."""

from __future__ import annotations

import pytest

from tests.core.test_scheduler_scenarios import Harness

IMG = 999  # the placeholder token id


def prompt_with_images(prefix: int, images: list[int], gap: int = 3) -> tuple[list[int], list[tuple[int, int, str]]]:
    """prefix text tokens, then per image `length` placeholders followed by `gap` text tokens."""
    tokens = list(range(1, prefix + 1))
    ranges = []
    for i, length in enumerate(images):
        ranges.append((len(tokens), length, f"h{i}"))
        tokens += [IMG] * length + list(range(100 * (i + 1), 100 * (i + 1) + gap))
    return tokens, ranges


def test_an_image_is_encoded_by_the_step_that_first_reaches_it():
    h = Harness(max_num_batched_tokens=8, max_num_encoder_input_tokens=16, encoder_cache_size=16)
    tokens, ranges = prompt_with_images(4, [10])  # placeholders 4..13
    h.add("a", tokens, mm_ranges=ranges)
    first = h.step()  # tokens 0..7 reach the image
    assert list(first.encoder_hashes) == ["h0"]
    second = h.step()  # 8..15: the rest of it, held from the first step
    assert list(second.encoder_hashes) == []
    h.run()
    assert h.finish["a"] == "length"


def test_the_encoder_budget_stops_a_step_short_of_the_next_image():
    h = Harness(max_num_batched_tokens=64, max_num_encoder_input_tokens=10, encoder_cache_size=30)
    tokens, ranges = prompt_with_images(2, [10, 10])  # images at 2..11 and 15..24
    h.add("a", tokens, mm_ranges=ranges)
    first = h.step()
    assert list(first.encoder_hashes) == ["h0"]
    assert list(first.num_scheduled_tokens) == [15]  # up to the second image
    second = h.step()
    assert list(second.encoder_hashes) == ["h1"]
    h.run()


def test_requests_with_the_same_image_share_one_encoding():
    h = Harness(max_num_batched_tokens=64, max_num_encoder_input_tokens=10, encoder_cache_size=10)
    tokens, ranges = prompt_with_images(2, [10])
    h.add("a", tokens, mm_ranges=ranges)
    h.add("b", [7] + tokens[1:], mm_ranges=ranges)  # another prompt, the same image
    plan = h.step()
    assert list(plan.encoder_hashes) == ["h0"] and plan.num_reqs == 2
    h.run()
    # Both finished: the output stays held (freeable) and a later request reuses it.
    h.add("c", [8] + tokens[1:], mm_ranges=ranges)
    assert list(h.step().encoder_hashes) == []
    h.run()


def test_a_full_encoder_cache_evicts_freeable_outputs_and_says_so():
    h = Harness(max_num_batched_tokens=64, max_num_encoder_input_tokens=10, encoder_cache_size=10)
    a, ra = prompt_with_images(2, [10])
    h.add("a", a, mm_ranges=ra)
    h.run()
    b, rb = prompt_with_images(3, [10])
    h.add("b", b, mm_ranges=[(rb[0][0], rb[0][1], "other")])
    plan = h.step()
    assert list(plan.freed_encoder_hashes) == ["h0"] and list(plan.encoder_hashes) == ["other"]
    h.run()


def test_a_request_waits_while_the_cache_is_held_by_running_ones():
    h = Harness(max_num_batched_tokens=6, max_num_encoder_input_tokens=10, encoder_cache_size=10)
    a, ra = prompt_with_images(1, [10])
    h.add("a", a, mm_ranges=ra)
    h.add("b", a, mm_ranges=[(ra[0][0], ra[0][1], "other")])
    first = h.step()  # a reaches its image (held until a passes it); b's image has no room
    assert list(first.req_ids) == ["a"] and list(first.encoder_hashes) == ["h0"]
    h.run()
    assert h.finish == {"a": "length", "b": "length"}


def test_preemption_releases_images_and_the_resumed_request_reuses_them():
    h = Harness(num_blocks=8, block_size=4, max_num_seqs=2, max_num_batched_tokens=32, max_model_len=32,
                max_num_encoder_input_tokens=8, encoder_cache_size=16)
    a, ra = prompt_with_images(1, [8])
    b, rb = prompt_with_images(2, [8])
    h.add("a", a, max_tokens=12, mm_ranges=ra)
    h.add("b", b, max_tokens=12, mm_ranges=[(rb[0][0], rb[0][1], "hb")])
    h.run()  # 8 blocks of 4 for two requests of up to 24 tokens: one is preempted and resumed
    assert set(h.finish) == {"a", "b"}
    assert h.scheduler.stats().num_preemptions >= 1


@pytest.mark.parametrize("ranges, message", [
    ([(2, 17, "h")], "exceeds what the encoder may take in one step"),
    ([(5, 4, "h"), (2, 4, "g")], "must be non-empty, in order"),
    ([(30, 4, "h")], "within the"),
    ([(2, 4, "")], "an image without a hash"),
])
def test_bad_image_ranges_are_refused(ranges, message):
    h = Harness(max_num_encoder_input_tokens=16, encoder_cache_size=16)
    with pytest.raises(ValueError, match=message):
        h.add("a", list(range(1, 21)), mm_ranges=ranges)


def test_a_text_model_refuses_images():
    h = Harness()
    with pytest.raises(ValueError, match="this model takes no images"):
        h.add("a", list(range(1, 21)), mm_ranges=[(2, 4, "h")])
