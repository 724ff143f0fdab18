"""Structured output's cost: a batch of 16 requests constrained by a JSON schema against the same
16 free, in one engine (SmolLM2, bf16 by default), stepped by hand so that each decode step is
timed alone. Prints a table and the ratios against the targets:

  - TPOT of JSON-schema decoding vs free decoding at batch 16 (target: <= 1.10x);
  - the bitmask: its fill time per step (llguidance), and the decode step with it vs without
    (target: <= 1.05x), filled while the forward runs (the engine's way) or, with --overlap off,
    before it;
  - a typical schema's compile time, cold and cached (targets: <= 50 ms, <= 1 ms);
  - every constrained output that ends (with "stop") valid against its schema (target: 100 %);
    one cut at max_tokens is an unfinished object, counted apart.

    .venv/bin/python bench/structured.py [--batch 16] [--tokens 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "minLength": 1, "maxLength": 40},
    "age": {"type": "integer", "minimum": 0, "maximum": 130},
    "email": {"type": "string", "format": "email"},
    "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 8},
    "address": {"type": "object", "properties": {"street": {"type": "string", "maxLength": 60},
                                                 "city": {"type": "string", "maxLength": 40},
                                                 "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
                "required": ["street", "city", "zip"], "additionalProperties": False}},
    "required": ["name", "age", "address"], "additionalProperties": False}


def compile_times(llm, repeats: int = 20) -> tuple[float, float]:
    """(cold, cached) seconds to compile SCHEMA for this model: cold on a fresh cache (the
    tokenizer's llguidance view built beforehand), cached as the median of repeats."""
    from corellm import StructuredOutputsParams
    from corellm.structured_output import GrammarCompiler

    tok = llm.get_tokenizer()
    compiler = GrammarCompiler(tok, llm.loaded.config.vocab_size, [tok.eos_token_id])
    compiler.ll_tokenizer  # noqa: B018 - built now, outside the timing
    spec = StructuredOutputsParams(json=SCHEMA)
    t0 = time.perf_counter()
    compiler.check(spec)
    cold = time.perf_counter() - t0
    cached = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        compiler.check(StructuredOutputsParams(json=SCHEMA))
        cached.append(time.perf_counter() - t0)
    compiler.shutdown()
    return cold, statistics.median(cached)


def run_batch(llm, prompts: list[str], params) -> tuple[list[float], list]:
    """Adds the batch, steps the engine until it is done; returns the durations of the steps in
    which every request decoded (one token each: the batch's TPOT), and the outputs."""
    core = llm.engine_core
    processed = [llm.input_processor.process(f"b{i}-{time.monotonic_ns()}", p, params) for i, p in enumerate(prompts)]
    for req in processed:
        llm.output_processor.add_request(req)
        for sample in req.samples:
            core.add_request(sample)
    decode_steps, results = [], {}
    while llm.output_processor.has_unfinished_requests():
        t0 = time.perf_counter()
        step = core.step()
        elapsed = time.perf_counter() - t0
        if step.num_scheduled_tokens == len(prompts) and len(step.outputs) == len(prompts):
            decode_steps.append(elapsed)
        outs, to_abort = llm.output_processor.process_outputs(step.outputs)
        core.abort_requests(to_abort)
        for out in outs:
            if out.finished:
                results[out.request_id] = out
    return decode_steps, [results[r.request_id] for r in processed]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--overlap", choices=["on", "off"], default="on",
                   help="fill the bitmask during the forward (the engine's way) or before it")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args()

    import jsonschema
    import torch

    from corellm import LLM, SamplingParams, StructuredOutputsParams

    llm = LLM(dtype=args.dtype, max_model_len=1024, kv_cache_memory=256 * 1024**2, max_num_seqs=args.batch)
    tok = llm.get_tokenizer()
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"Describe person number {i} as JSON."}])
               for i in range(args.batch)]
    cold, cached = compile_times(llm)
    free = SamplingParams(temperature=0.8, seed=1, max_tokens=args.tokens, ignore_eos=True)
    constrained = SamplingParams(temperature=0.8, seed=1, max_tokens=args.tokens,
                                 structured_outputs=StructuredOutputsParams(json=SCHEMA))
    manager = llm.engine_core.structured_output
    manager.overlap = args.overlap == "on"
    run_batch(llm, prompts, free)  # warm-up
    rounds = {"free": [], "json_schema": []}
    valid = stopped = total = 0
    fills: list[float] = []
    for _ in range(3):  # alternated, each engine state alike
        steps, _ = run_batch(llm, prompts, free)
        rounds["free"] += steps
        manager.fill_seconds.clear()
        steps, outs = run_batch(llm, prompts, constrained)
        rounds["json_schema"] += steps
        fills += list(manager.fill_seconds)
        for out in outs:
            total += 1
            if out.outputs[0].finish_reason != "stop":
                continue  # cut at max_tokens: an unfinished object
            stopped += 1
            try:
                jsonschema.validate(json.loads(out.outputs[0].text), SCHEMA)
                valid += 1
            except (ValueError, jsonschema.ValidationError):
                pass
    tpot_free = statistics.median(rounds["free"])
    tpot_json = statistics.median(rounds["json_schema"])
    fill = statistics.median(fills) if fills else float("nan")
    print(f"\nSmolLM2-135M {args.dtype}, batch {args.batch}, up to {args.tokens} tokens, threads "
          f"{torch.get_num_threads()}, bitmask {'during' if manager.overlap else 'before'} the forward; "
          f"{len(rounds['free'])} / {len(rounds['json_schema'])} decode steps timed")
    print(f"{'measure':<44} {'value':>12} {'target':>10}")
    rows = [
        ("TPOT free (median decode step, ms)", tpot_free * 1e3, ""),
        ("TPOT JSON schema (median decode step, ms)", tpot_json * 1e3, ""),
        ("TPOT ratio JSON / free", tpot_json / tpot_free, "<= 1.10"),
        ("bitmask fill per step (median, ms)", fill * 1e3, ""),
        ("bitmask fill / free decode step", fill / tpot_free, ""),
        ("compile, cold (ms)", cold * 1e3, "<= 50"),
        ("compile, cached (ms)", cached * 1e3, "<= 1"),
        ("outputs ended by their grammar (%)", 100.0 * stopped / max(total, 1), ""),
        ("valid among them (%)", 100.0 * valid / max(stopped, 1), "100"),
    ]
    for name, value, target in rows:
        print(f"{name:<44} {value:>12.3f} {target:>10}")
    print(f"(the step ratio is the bitmask's share left visible: {tpot_json / tpot_free:.3f}x vs <= 1.05x)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "tpot_free_s": tpot_free, "tpot_json_s": tpot_json, "fill_s": fill,
                       "compile_cold_s": cold, "compile_cached_s": cached, "valid": valid, "stopped": stopped,
                       "total": total, "overlap": manager.overlap}, f,
                      indent=1)


if __name__ == "__main__":
    main()
