"""StructuredOutputManager: the engine's structured requests and their grammar matchers.

Per step (EngineCore.step, seed 000 step 3):
  1. start_bitmask(scheduler_output) begins filling the packed bitmask of allowed tokens for the
     step's structured rows (the scheduler marks them: SchedulerOutput.uses_grammar) in
     llguidance's executor (which releases the GIL), on a worker thread while the forward runs
     (overlap=False: at once, before it; bench/structured.py measures both: the overlap wins even
     where the forward's threads occupy every core);
  2. the model runner's sampler applies the GrammarOutput;
  3. accept(request id, token) advances the request's matcher with the token the step sampled
     (a rejected token ends the request with an error). A complete grammar allows only EOS, so
     the request then ends on EOS as any other does (vLLM's behaviour).
A reasoning model's request (EngineCoreRequest.grammar_starts_after) samples freely until its
output holds the end of its reasoning block; its grammar applies from the next token on. With a
reasoning budget (EngineCoreRequest.reasoning_budget) the block is cut once it has taken its
tokens: the request's matcher becomes the forced end's ("</think>", then its grammar or any
text); reasoning_wait.py states the rule.

A request whose grammar is still compiling waits here (awaiting) and enters the scheduler once
its matcher is ready: the others are not held up."""

from __future__ import annotations

import collections
import concurrent.futures
import time

import numpy as np

from corellm.engine_core_request import EngineCoreRequest
from corellm.structured_output.grammar_compiler import GrammarCompiler
from corellm.structured_output.grammar_output import GrammarOutput
from corellm.structured_output.grammar_spec import llguidance_module
from corellm.structured_output.reasoning_wait import ForcedReasoningEnd, ReasoningWait


class StructuredOutputManager:
    def __init__(self, compiler: GrammarCompiler, overlap: bool = True):
        self.compiler = compiler
        self.overlap = overlap  # fill the bitmask while the forward runs (see above)
        self.words = (compiler.vocab_size + 31) // 32  # int32 words per bitmask row
        self.matchers: dict = {}  # request id -> its llguidance.LLMatcher
        # request id -> (the request, its futures: of its grammar's matcher, of its forced end's)
        self.awaiting: dict[str, tuple[EngineCoreRequest, list[concurrent.futures.Future | None]]] = {}
        self.dormant: dict[str, ReasoningWait] = {}  # request id -> its wait for the end of its reasoning
        self.forced_ends: dict = {}  # request id -> the matcher of its reasoning's forced end, for when it is spent
        self._executor = None  # llguidance.LLExecutor, made on first use (it starts threads)
        self._worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="corellm-bitmask")
        self.fill_seconds: collections.deque[float] = collections.deque(maxlen=4096)  # recent bitmask fills (bench/structured.py)

    # ------------------------------------------------------------------ requests
    def add(self, request: EngineCoreRequest) -> None:
        """Starts getting the request's matchers; ready() hands the request back once they exist."""
        spec = request.sampling_params.structured_outputs
        futures = [self.compiler.matcher_future(spec) if request.grammar_key is not None else None,
                   self.compiler.matcher_future(ForcedReasoningEnd(spec)) if request.reasoning_budget else None]
        self.awaiting[request.request_id] = (request, futures)

    def ready(self, timeout: float = 0.0) -> list[tuple[EngineCoreRequest, str | None, bool]]:
        """The awaiting requests whose matcher is done (waiting up to `timeout` seconds for the
        first), each with None or the error that ends it, and whether that error is the spec's
        fault (a grammar that does not compile) rather than the engine's."""
        if not self.awaiting:
            return []
        if timeout > 0:
            concurrent.futures.wait([f for _, fs in self.awaiting.values() for f in fs if f is not None], timeout,
                                    return_when=concurrent.futures.FIRST_COMPLETED)
        done = []
        for req_id, (request, (grammar, forced_end)) in list(self.awaiting.items()):
            if not all(f.done() for f in (grammar, forced_end) if f is not None):
                continue
            del self.awaiting[req_id]
            try:
                if grammar is not None:
                    self.matchers[req_id] = grammar.result()
                if forced_end is not None:
                    self.forced_ends[req_id] = forced_end.result()
                if request.grammar_starts_after or request.reasoning_budget:
                    wait = ReasoningWait(request.reasoning_budget)
                    if wait.exhausted_at_start:
                        self._force_the_end(req_id)
                    else:
                        self.dormant[req_id] = wait
                done.append((request, None, False))
            except ValueError as e:  # the spec: named in the message (GrammarCompiler)
                self.remove([req_id])
                done.append((request, str(e), True))
            except Exception as e:  # noqa: BLE001 - a compiler failure ends its request only
                self.remove([req_id])
                done.append((request, f"{type(e).__name__}: {e}", False))
        return done

    def remove(self, request_ids) -> None:
        for req_id in request_ids:
            self.matchers.pop(req_id, None)
            self.forced_ends.pop(req_id, None)
            self.dormant.pop(req_id, None)
            awaiting = self.awaiting.pop(req_id, None)
            if awaiting is not None:
                for future in awaiting[1]:
                    if future is not None:
                        future.cancel()

    # ------------------------------------------------------------------ the step
    def start_bitmask(self, so) -> concurrent.futures.Future | None:
        """Begins filling the step's GrammarOutput (None when no row is structured)."""
        flags = so.uses_grammar
        if not flags.any():
            return None
        req_ids = so.req_ids
        # The marked rows whose grammar applies now (not those still reasoning, nor a reasoning
        # budget's whose reasoning ended by itself without a grammar for the answer).
        rows = np.array([i for i in np.flatnonzero(flags).tolist()
                         if req_ids[i] in self.matchers and req_ids[i] not in self.dormant], dtype=np.int64)
        if not len(rows):
            return None
        bitmask = np.empty((len(rows), self.words), dtype=np.int32)
        bitmask_rows = np.full(len(req_ids), -1, dtype=np.int32)
        bitmask_rows[rows] = np.arange(len(rows), dtype=np.int32)
        matchers = [(self.matchers[req_ids[i]], k) for k, i in enumerate(rows.tolist())]
        if self._executor is None:
            self._executor = llguidance_module().LLExecutor()
        from llguidance.numpy import fill_next_token_bitmask_par

        def fill() -> GrammarOutput:
            t0 = time.perf_counter()
            fill_next_token_bitmask_par(self._executor, matchers, bitmask)
            self.fill_seconds.append(time.perf_counter() - t0)
            return GrammarOutput(bitmask, bitmask_rows)

        if self.overlap:
            return self._worker.submit(fill)
        done: concurrent.futures.Future = concurrent.futures.Future()
        done.set_result(fill())
        return done

    def accept(self, req_id: str, token: int) -> str | None:
        """Advances the request's matcher (if it has one) with its sampled token: None, or the
        error that ends the request (the spec's fault: its message begins "structured_outputs").

        Two ways the output can fail to follow the grammar, both when the grammar demands text
        that this model's vocabulary cannot spell (SmolLM2's has no token for some bytes, such
        as 0xF1 and 0xF2, which begin UTF-8 characters of planes 4 to 11):
          - no token can continue the output: llguidance then flags the matcher while filling the
            bitmask and allows only EOS, which would end the request as if its output were whole;
          - llguidance's fast path for a forced string tokenizes it, and a tokenizer that drops
            the bytes it cannot spell yields a token that the matcher then refuses (llguidance
            issue 366)."""
        if req_id in self.dormant:
            self._watch(req_id, token)
            return None
        matcher = self.matchers.get(req_id)
        if matcher is None:
            return None
        if matcher.is_error():
            return (f"structured_outputs: no token of this model's vocabulary can continue the output as the grammar "
                    f"requires ({_first_line(matcher.get_error())})")
        if matcher.consume_token(token):
            return None
        return (f"structured_outputs: the output cannot follow the grammar with this model's vocabulary: the "
                f"sampled token {token} was refused ({_first_line(matcher.get_error())})")

    def _watch(self, req_id: str, token: int) -> None:
        """A dormant grammar wakes once the output holds the end of the reasoning (the token after
        it is the grammar's first); a spent budget forces that end."""
        state = self.dormant[req_id].feed(self.compiler.tokenizer.decode([token], skip_special_tokens=False))
        if state == "ended":
            del self.dormant[req_id]
            self.forced_ends.pop(req_id, None)
        elif state == "exhausted":
            del self.dormant[req_id]
            self._force_the_end(req_id)

    def _force_the_end(self, req_id: str) -> None:
        """From the next token on, the request follows its forced end's grammar."""
        self.matchers[req_id] = self.forced_ends.pop(req_id)

    def shutdown(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
        self.compiler.shutdown()


def _first_line(llguidance_error: str) -> str:
    """llguidance's error without the parser state it dumps after the first line."""
    return llguidance_error.strip().split("\n", 1)[0]
