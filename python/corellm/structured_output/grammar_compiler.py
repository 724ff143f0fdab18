"""GrammarCompiler: StructuredOutputsParams -> llguidance matchers for one model's tokenizer.

Compiling checks the grammar against the tokenizer (a bad schema, regex or grammar, or a JSON
schema keyword llguidance cannot enforce, is a ValueError naming the field) and builds a pristine
matcher; compiled grammars are kept in a bounded LRU cache keyed by the spec, and each request
gets a deep copy (cheap). check() compiles on the caller's thread, when a request arrives, before
it is admitted; matcher_future() serves the engine thread from the cache, or compiles on a worker
thread so that a request whose grammar is not ready waits without holding up the others.

The llguidance tokenizer is built once, on the worker thread: at warm() (the server calls it when
first idle after start-up) or at the first structured request."""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections import OrderedDict

from corellm.sampling_params import StructuredOutputsParams
from corellm.structured_output.grammar_spec import grammar_of, llguidance_module
from corellm.tokenizer import Tokenizer

logger = logging.getLogger("corellm")


class GrammarCompiler:
    def __init__(self, tokenizer: Tokenizer, vocab_size: int, eos_token_ids: list[int], cache_size: int = 256):
        self.vocab_size = vocab_size  # the logits' width: the bitmask covers every row of the LM head
        self._cache: OrderedDict = OrderedDict()  # spec key -> its pristine llguidance.LLMatcher
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="corellm-grammar")
        self._tokenizer, self._eos_token_ids = tokenizer, list(eos_token_ids)
        self._ll_tokenizer: concurrent.futures.Future | None = None
        self._spelled_bytes: frozenset[int] | None = None  # the bytes some ordinary token holds

    def warm(self) -> None:
        """Starts building llguidance's view of the tokenizer (a fraction of a second to a few
        seconds, by vocabulary) on the worker thread, so that the first structured request does
        not wait for it. Otherwise it is built on first use."""
        with self._lock:
            if self._ll_tokenizer is None:
                # Its own thread: a compile waiting for it on the pool's one worker would deadlock.
                self._ll_tokenizer = concurrent.futures.ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="corellm-ll-tokenizer").submit(
                    lambda: llguidance_module().LLTokenizer(self._tokenizer.backend.to_str(), n_vocab=self.vocab_size,
                                                            eos_token=self._eos_token_ids or None))

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    @property
    def ll_tokenizer(self):  # -> llguidance.LLTokenizer
        self.warm()
        return self._ll_tokenizer.result()

    @property
    def spelled_bytes(self) -> frozenset[int]:
        """The byte values that occur in some ordinary token of the vocabulary: text holding any
        other byte cannot be produced by this model (SmolLM2's vocabulary lacks 0xF1 and 0xF2,
        which begin the UTF-8 characters U+40000 to U+BFFFF, and a few control characters)."""
        if self._spelled_bytes is None:
            ll = self.ll_tokenizer
            ordinary = [t for t in range(self.vocab_size) if not ll.is_special_token(t)]
            self._spelled_bytes = frozenset(ll.decode_bytes(ordinary))
        return self._spelled_bytes

    def check(self, spec: StructuredOutputsParams) -> None:
        """Compiles the spec now (or finds it compiled): ValueError naming the field if it is bad."""
        self._compiled(spec)

    def matcher_future(self, spec: StructuredOutputsParams) -> concurrent.futures.Future:
        """A future of a fresh matcher for one request: done at once when the grammar is cached,
        else compiled on the worker thread."""
        with self._lock:
            pristine = self._cache.get(spec.key())
        if pristine is not None:
            done: concurrent.futures.Future = concurrent.futures.Future()
            done.set_result(pristine.deep_copy())
            return done
        return self._pool.submit(lambda: self._compiled(spec).deep_copy())

    def _compiled(self, spec: StructuredOutputsParams):  # -> llguidance.LLMatcher
        llguidance = llguidance_module()
        key = spec.key()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        if spec.kind == "choice":
            self._check_spelled(spec.choice)
        grammar = grammar_of(spec)
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.ll_tokenizer)
        if is_error:
            raise ValueError(f"structured_outputs.{spec.kind}: {messages[0].strip()}")
        for warning in messages:
            logger.warning("structured_outputs.%s: %s", spec.kind, warning)
        matcher = llguidance.LLMatcher(self.ll_tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"structured_outputs.{spec.kind}: {matcher.get_error()}")
        with self._lock:
            self._cache[key] = matcher
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return matcher

    def _check_spelled(self, choices: list[str]) -> None:
        """A choice this model cannot spell is a ValueError naming it (the grammar alone would let
        the output start down its path and then find no token to go on with)."""
        spelled = self.spelled_bytes
        for i, choice in enumerate(choices):
            for char in choice:
                missing = [b for b in char.encode("utf-8", "surrogatepass") if b not in spelled]
                if missing:
                    raise ValueError(f"structured_outputs.choice[{i}]: this model's vocabulary cannot spell {char!r} "
                                     f"(no token holds the byte 0x{missing[0]:02x})")

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
