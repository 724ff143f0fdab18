"""Speculative decoding against none, same run, same loaded model, offline API: copy-heavy
prompts (copy a paragraph, rename a function in code, quote an answer from a passage) and
free-writing ones (stories, explanations), one request at a time and 16 at a time (48 requests
through max_num_seqs 16: a finished request's place is taken at once, as when serving; --rounds 1:
one fixed batch of 16, whose time is its slowest request's), greedy. Each
cell runs the plain engine and the speculative one in turn, `--repeats` times (a noisy VM moves
both alike), and keeps the median; the table gives output tok/s, the ratio, the drafts' acceptance
rate and mean accepted length, and whether the outputs were identical (they must be, greedy).
The "predicted" workloads are the free-writing prompts with a `prediction` (OpenAI's Predicted
Outputs) on the speculative side: the plain engine's own reply to the prompt (the best case: a
client asking again for an answer it holds, as a regenerate button), and that reply with every
seventh word replaced ("predicted~"): the drafts come from the prediction where the output follows it.

    .venv/bin/python bench/spec_decode.py
    .venv/bin/python bench/spec_decode.py --speculative-config '{"method": "ngram", "num_speculative_tokens": 8}'
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

PARAGRAPHS = [
    "The committee met on Tuesday to review the budget for the coming year. After a long discussion, the members "
    "agreed to increase spending on public libraries by ten percent, to repair the bridge over the river before "
    "winter, and to hire two more teachers for the primary school. The mayor thanked everyone for their work and "
    "closed the meeting at nine in the evening.",
    "Honey bees live in colonies of up to sixty thousand workers, a single queen and a few hundred drones. The "
    "workers build wax combs, collect nectar and pollen, and keep the hive at a steady temperature by fanning "
    "their wings in summer and clustering together in winter. A strong colony can store more than twenty "
    "kilograms of honey in a good season.",
    "To reset the router, unplug it from the wall and wait thirty seconds. Plug it back in and wait until the "
    "power light stops blinking. Then press and hold the reset button on the back for ten seconds, until all "
    "the lights flash at once. The router will restart with its factory settings, and the default password is "
    "printed on the label underneath.",
    "The train leaves the central station at seven fifteen every morning and stops at the airport, the "
    "university and the old harbour before reaching the coast. Tickets can be bought on board or at the "
    "machines on each platform. On Sundays the first train leaves an hour later, and bicycles travel free of "
    "charge in the last carriage.",
]
CODE = '''def merge_sorted(a, b):
    result = []
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i] <= b[j]:
            result.append(a[i])
            i += 1
        else:
            result.append(b[j])
            j += 1
    result.extend(a[i:])
    result.extend(b[j:])
    return result


def binary_search(items, target):
    lo, hi = 0, len(items) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if items[mid] == target:
            return mid
        if items[mid] < target:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1
'''
COPY_TASKS = ["Copy this paragraph exactly, word for word:\n\n{p}",
              "Repeat the following text without changing anything:\n\n{p}",
              "Here is a passage.\n\n{p}\n\nQuote the passage in full.",
              "Rename the function merge_sorted to merge_lists in this code and output the whole code:\n\n" + CODE]
FREE = ["Write a short story about a dragon who learns to bake bread.",
        "Explain how a refrigerator keeps food cold.",
        "Describe a walk through a forest in autumn.",
        "Write a letter to a friend about your summer holiday.",
        "What are the advantages and disadvantages of living in a big city?",
        "Write a poem about the sea at night.",
        "Explain why the sky is blue to a ten year old.",
        "Give some tips for learning to play the guitar."]


def predicted_prompts(replies: dict[str, str], every: int = 0):
    """The free prompts, each with its prediction: the reply in `replies` (by the prompt's text),
    with every `every`-th word replaced when every > 0."""
    def make(n: int) -> list[tuple[list[dict], str]]:
        out = []
        for conv in free_prompts(n):
            words = replies[conv[0]["content"]].split(" ")
            if every:
                words = [w if (k + 1) % every else "something" for k, w in enumerate(words)]
            out.append((conv, " ".join(words)))
        return out
    return make


def copy_prompts(n: int) -> list[list[dict]]:
    out = []
    for i in range(n):
        task = COPY_TASKS[i % len(COPY_TASKS)]
        out.append([{"role": "user", "content": task.format(p=PARAGRAPHS[(i // len(COPY_TASKS) + i) % len(PARAGRAPHS)])}])
    return out


def free_prompts(n: int) -> list[list[dict]]:
    return [[{"role": "user", "content": FREE[i % len(FREE)] + ("" if i < len(FREE) else " Be brief.")}]
            for i in range(n)]


def timed(llm, conversations, params) -> tuple[float, list[list[int]]]:
    """conversations: each a list of messages, or (messages, prediction) for the speculative side
    of the edit workload (params then becomes one SamplingParams per conversation)."""
    if conversations and isinstance(conversations[0], tuple):
        predictions = [p if llm.config.speculative_config is not None else None for _, p in conversations]
        params = [params.clone() for _ in conversations]
        for one, prediction in zip(params, predictions):
            one.prediction = prediction
        conversations = [c for c, _ in conversations]
    t = time.perf_counter()
    outs = llm.chat(conversations, params, use_tqdm=False)
    dt = time.perf_counter() - t
    tokens = [o.outputs[0].token_ids for o in outs]
    return sum(len(x) for x in tokens) / dt, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speculative-config", default=json.dumps(
        {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}))
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3, help="requests per batch cell = rounds x batch")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from corellm import LLM, SamplingParams
    from corellm.model import load_model
    from corellm.native import cpu_kernel_path

    spec = json.loads(args.speculative_config)
    loaded = load_model(progress=False)
    engine = dict(max_model_len=2048, kv_cache_memory=512 * 1024**2, max_num_seqs=args.batch)
    plain = LLM(loaded_model=loaded, **engine)
    speculative = LLM(loaded_model=loaded, speculative_config=spec, **engine)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)
    for llm in (plain, speculative):  # warm up both (first-call costs, the KV cache's memory commit)
        llm.chat(copy_prompts(args.batch), params, use_tqdm=False)
    print(f"CPU path: {cpu_kernel_path()}, {torch.get_num_threads()} threads; speculative_config {spec}")
    print(f"{'workload':<18} {'plain tok/s':>12} {'spec tok/s':>11} {'ratio':>7} {'accept':>7} {'mean acc':>9} "
          f"{'identical':>9}")
    replies = {c[0]["content"]: o.outputs[0].text for c, o in zip(
        free_prompts(args.rounds * args.batch), plain.chat(free_prompts(args.rounds * args.batch), params, use_tqdm=False))}
    workloads = (("copy", copy_prompts), ("free", free_prompts), ("predicted", predicted_prompts(replies)),
                 ("predicted~", predicted_prompts(replies, every=7)))
    for name, make in workloads:
        for batch in (1, args.batch):
            convs = make(4 if batch == 1 else args.rounds * batch)
            groups = [convs[i:i + 1] for i in range(4)] if batch == 1 else [convs]  # 1: four prompts in turn
            plain_rates, spec_rates, identical = [], [], True
            before = speculative.get_metrics()
            for _ in range(args.repeats):
                for llm, rates in ((plain, plain_rates), (speculative, spec_rates)):
                    tokens_all, t_all = 0, 0.0
                    outs = []
                    for g in groups:
                        rate, tokens = timed(llm, g, params)
                        n = sum(len(x) for x in tokens)
                        tokens_all, t_all = tokens_all + n, t_all + n / rate
                        outs += tokens
                    rates.append(tokens_all / t_all)
                    if llm is plain:
                        expected = outs
                    else:
                        identical &= outs == expected
            after = speculative.get_metrics()
            drafts = after["corellm:spec_decode_num_draft_tokens"] - before["corellm:spec_decode_num_draft_tokens"]
            accepted = after["corellm:spec_decode_num_accepted_tokens"] - before["corellm:spec_decode_num_accepted_tokens"]
            verifications = after["corellm:spec_decode_num_drafts"] - before["corellm:spec_decode_num_drafts"]
            p, s = statistics.median(plain_rates), statistics.median(spec_rates)
            print(f"{name + ' x' + str(batch):<18} {p:>12.1f} {s:>11.1f} {s / p:>6.2f}x "
                  f"{accepted / max(drafts, 1):>7.2f} {accepted / max(verifications, 1):>9.2f} {str(identical):>9}")


if __name__ == "__main__":
    main()
