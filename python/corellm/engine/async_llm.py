"""AsyncLLM: the engine for asyncio programs. One dedicated engine thread runs EngineCore.step()
in a loop; requests and aborts reach it, in the order they were made, through a thread-safe inbox
drained at the top of each step (it sleeps on the inbox when idle), where aborts enter the engine
core's own abort queue (its one abort path); outputs come back to the event loop with call_soon_threadsafe, where the OutputProcessor
turns them into RequestOutputs for each request's asyncio.Queue. Cancelling a generate() aborts
its request and frees its KV blocks.

The queued load (requests admitted that have not produced a token yet, and their prompt tokens)
is counted here, on the event loop, so that a server can refuse work before it is submitted.

Where the engine's CPU threads take every core (engine_takes_every_core), the engine thread waits
after each step, at most HANDOFF_WAIT_S, until the event loop has handed the step's outputs to their
requests' handlers (which write them out), and only then starts the next step: done during the
forward instead, that work took a core from the kernels' thread team, whose other threads then
waited for it at the kernels' barriers (see HANDOFF_WAIT_S)."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import functools
import logging
import os
import queue
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field

import torch

from corellm.config import EngineConfig
from corellm.distributed.spawned_processes import refuse_while_importing_main
from corellm.engine.engine_core_outputs import EngineCoreOutputs
from corellm.engine.engine_parts import EngineParts
from corellm.engine.input_processor import ProcessedRequest
from corellm.inputs import PromptType
from corellm.lora.lora_request import LoRARequest
from corellm.model.loader import LoadedModel
from corellm.native import _core
from corellm.outputs import RequestOutput
from corellm.sampling_params import SamplingParams

logger = logging.getLogger("corellm")


class EngineDeadError(RuntimeError):
    """The engine thread stopped with an error; no request can be served."""


@dataclass
class RequestStats:
    """A request's timeline (time.monotonic()), read from the engine's steps whatever the request's
    output kind (a request that is not streamed gets its first token as early as one that is)."""

    arrival: float
    first_token: float | None = None
    last_token: float | None = None
    generation_tokens: int = 0  # over its samples
    # Between consecutive steps that gave the request tokens (vLLM's inter-token latency: a step
    # that gives several, speculative decoding's, counts once).
    token_gaps: list[float] = field(default_factory=list)

    def on_tokens(self, now: float, count: int) -> None:
        """`count` new tokens of one of its samples, in the step whose outputs came at `now`."""
        if self.first_token is None:
            self.first_token = now
        elif self.last_token != now:  # the step's first sample with news (n > 1: the others add tokens only)
            self.token_gaps.append(now - self.last_token)
        self.last_token = now
        self.generation_tokens += count


@dataclass
class _Pending:
    queue: asyncio.Queue
    processed: ProcessedRequest
    stats: RequestStats
    sample_ids: list[str] = field(default_factory=list)
    queued: bool = True  # no token came yet: counted in the queued load


# The most the engine thread waits for the event loop to take a step's outputs (a loop busy with
# something else, a long prompt's tokenization, holds the engine up no longer than this a step).
# Measured on an Intel Xeon VM (2 cores, SmolLM2-135M bf16, bench/serve.py at concurrency 64, 64 x
# (128 in, 128 out), servers alternating, six runs without and four with): 1210-1278 -> 1254-1276
# output tok/s (median 1242 -> 1272). The handlers' work now comes between the forwards, where the
# kernels' team has no barrier to wait at.
HANDOFF_WAIT_S = 0.01
# Rounds of the event loop's ready callbacks after the one that hands the outputs out (_hand_out):
# a streamed request's output goes to its queue there, the task reading that queue passes it on to
# the response's merged queue in the next round (Serving.merged), and the response's task formats
# and writes it in the round after; the event is set in the round after that.
HANDOFF_ROUNDS = 3


def engine_takes_every_core(device: str, engine_threads: int, local_ranks: int = 1) -> bool:
    """Whether the engine's kernels run on the CPU with as many threads (over its `local_ranks`
    processes on this machine, tensor parallelism's) as this process has cores to run on: the event
    loop's work then has no core of its own while a forward runs."""
    return device == "cpu" and engine_threads * local_ranks >= len(os.sched_getaffinity(0))


def _stop_engine_thread(thread: threading.Thread, inbox: queue.SimpleQueue, timeout_s: float = 10.0) -> None:
    """Asks the engine thread to stop after its current step and waits for it (at most timeout_s)."""
    inbox.put(("stop", None))
    thread.join(timeout_s)


class AsyncLLM:
    def __init__(self, config: EngineConfig, loaded: LoadedModel | None = None):
        refuse_while_importing_main("AsyncLLM")
        self.config = config
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()  # ("start" | "add" | "abort" | "stop", payload)
        self._started = False
        # The engine thread loads the model and builds the engine itself, then waits for start():
        # the process's OpenMP thread team then belongs to the thread that runs the kernels. (A
        # team made by the loading thread would stay, and with more OpenMP threads than cores
        # libgomp stops spinning between parallel regions, and every decode step pays for it.)
        built = threading.Event()
        failure: list[BaseException] = []

        def build() -> bool:
            try:
                self.parts = EngineParts.build(config, loaded)
                return True
            except BaseException as e:  # noqa: BLE001 - re-raised by the constructor
                failure.append(e)
                return False
            finally:
                built.set()

        self._thread: threading.Thread | None = threading.Thread(target=self._engine_thread, args=(build,),
                                                                 name="corellm-engine", daemon=True)
        self._thread.start()
        # A program that ends without shutdown() has its engine thread stopped and joined before the
        # interpreter finalizes: ended there in the middle of a step (a kernel called with the GIL
        # given up), the thread was killed through a C++ frame and the process died with
        # std::terminate, exit code 134 ("terminate called without an active exception").
        self._stop_at_exit = functools.partial(_stop_engine_thread, self._thread, self._inbox)
        atexit.register(self._stop_at_exit)
        built.wait()
        if failure:
            self._thread.join()
            atexit.unregister(self._stop_at_exit)
            raise failure[0]
        self.loaded, self.engine_core = self.parts.loaded, self.parts.engine_core
        self.input_processor, self.output_processor = self.parts.input_processor, self.parts.output_processor
        self._requests: dict[str, _Pending] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.dead_error: BaseException | None = None
        self.stats = _core.SchedulerStats()  # the latest step's (all zero before the first)
        self.num_queued_requests = 0  # engine-core requests admitted without a token yet
        self.num_queued_tokens = 0  # their prompt tokens
        self.listeners: list = []  # callables(request_outputs, core_outputs), after every step
        self.done_listeners: list = []  # callables(final RequestOutput, RequestStats, finished_at)

    # ------------------------------------------------------------------ lifecycle
    @property
    def max_model_len(self) -> int:
        return self.engine_core.max_model_len

    @property
    def tokenizer(self):
        return self.loaded.tokenizer

    def start(self) -> None:
        """Starts stepping; call from the event loop that will consume the outputs."""
        if self._started or self._thread is None:
            return
        self._started = True
        self._loop = asyncio.get_running_loop()
        self._inbox.put(("start", None))

    async def shutdown(self) -> None:
        if self._thread is None:
            return
        atexit.unregister(self._stop_at_exit)
        await asyncio.get_running_loop().run_in_executor(None, self._stop_at_exit)
        self._thread = None

    # ------------------------------------------------------------------ engine thread
    def _engine_thread(self, build) -> None:
        """Builds the engine, waits for start() (or stop), then steps until stopped."""
        if not build():
            return
        try:
            kind, _ = self._inbox.get()
            if kind == "start":
                self._engine_loop()
        finally:  # on the thread that built them: the CUDA graphs
            self.engine_core.shutdown()

    def _engine_loop(self) -> None:
        core = self.engine_core
        workers = core.model_runner.tp_workers
        wait_for_handoff = engine_takes_every_core(torch.device(self.config.device).type, torch.get_num_threads(),
                                                   workers.spec.ranks_per_node if workers is not None else 1)
        try:
            self._post(EngineCoreOutputs(scheduler_stats=core.stats()))  # the idle figures, at once
            while True:
                block = not core.has_unfinished_requests()
                while True:
                    try:
                        kind, payload = self._inbox.get(block=block)
                    except queue.Empty:
                        break
                    block = False
                    if kind == "stop":
                        return
                    if kind == "add":
                        for sample in payload:
                            core.add_request(sample)
                    else:  # after the adds that came before it: an abort never overtakes its request
                        core.abort_requests(payload)
                if not core.has_unfinished_requests():
                    self._post(EngineCoreOutputs(scheduler_stats=core.stats()))
                    continue
                outputs = core.step()
                if not (wait_for_handoff and core.has_unfinished_requests()):
                    self._post(outputs)
                    continue
                handed_over = threading.Event()
                self._post(outputs, handed_over)
                handed_over.wait(HANDOFF_WAIT_S)
        except BaseException as e:  # noqa: BLE001 - reported, never hidden
            if isinstance(e, RuntimeError) and self._loop is not None and self._loop.is_closed():
                # the program's event loop ended without shutdown(): nobody is left to take the
                # outputs, so the engine stops (at exit, _stop_engine_thread joins it)
                logger.info("the event loop was closed without AsyncLLM.shutdown(); the engine stops")
                return
            logger.exception("the engine thread died")
            self.dead_error = e
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._fail_all, e)

    def _post(self, outputs: EngineCoreOutputs, handed_over: threading.Event | None = None) -> None:
        """To the event loop (RuntimeError once it is closed); `handed_over` is set there once the
        responses have written them (HANDOFF_ROUNDS)."""
        self._loop.call_soon_threadsafe(self._on_outputs, outputs, handed_over)

    # ------------------------------------------------------------------ event loop side
    def _on_outputs(self, core_outputs: EngineCoreOutputs, handed_over: threading.Event | None = None) -> None:
        try:
            self._hand_out(core_outputs)
        finally:
            if handed_over is not None:
                self._loop.call_soon(self._set_after_rounds, handed_over, HANDOFF_ROUNDS)

    def _set_after_rounds(self, event: threading.Event, rounds: int) -> None:
        """Sets `event` once the event loop has run `rounds` more rounds of its ready callbacks."""
        if rounds <= 1:
            event.set()
        else:
            self._loop.call_soon(self._set_after_rounds, event, rounds - 1)

    def _hand_out(self, core_outputs: EngineCoreOutputs) -> None:
        self.stats = core_outputs.scheduler_stats
        if not core_outputs.outputs:
            for listener in self.listeners:
                listener([], core_outputs)
            return
        now = time.monotonic()
        # Each request's timeline from the engine's own outputs, whatever its output kind (before
        # process_outputs, which forgets the requests that finish in this step).
        for core in core_outputs.outputs:
            state = self.output_processor.requests.get(core.req_id)
            pending = self._requests.get(state.request.request_id) if state is not None else None
            if pending is not None and core.new_token_ids:
                pending.stats.on_tokens(now, len(core.new_token_ids))
                self._dequeue(pending)  # its first token came: no longer queued
        try:
            outputs, to_abort = self.output_processor.process_outputs(core_outputs.outputs)
        except Exception as e:  # noqa: BLE001 - a detokenizer failure ends the requests involved
            logger.exception("output processing failed")
            ids = {o.req_id for o in core_outputs.outputs}
            for req_id, pending in list(self._requests.items()):
                if ids.intersection(pending.sample_ids):
                    self._finish_with_error(req_id, e)
            return
        if to_abort:
            self._abort_in_engine(to_abort)
        for out in outputs:
            pending = self._requests.get(out.request_id)
            if pending is None:
                continue
            if out.finished:
                self._dequeue(pending)
            pending.queue.put_nowait(out)
        for listener in self.listeners:
            listener(outputs, core_outputs)

    def _dequeue(self, pending: _Pending) -> None:
        if pending.queued:
            pending.queued = False
            self.num_queued_requests -= pending.processed.num_samples
            self.num_queued_tokens -= pending.processed.num_prompt_tokens

    def _forget(self, request_id: str) -> _Pending | None:
        pending = self._requests.pop(request_id, None)
        if pending is not None:
            self._dequeue(pending)
        return pending

    def open_request_states(self) -> dict[str, int]:
        """How many requests each layer holds state for (all 0 when idle: nothing leaks)."""
        return {"async_llm": len(self._requests), "output_processor": len(self.output_processor.requests),
                "queued": self.num_queued_requests, "scheduler": self.stats.num_running + self.stats.num_waiting}

    def _finish_with_error(self, request_id: str, error: BaseException) -> None:
        pending = self._requests.get(request_id)
        if pending is None:
            return
        self._abort_samples(pending.sample_ids)
        pending.queue.put_nowait(error)

    def _fail_all(self, error: BaseException) -> None:
        for req_id in list(self._requests):
            pending = self._requests[req_id]
            pending.queue.put_nowait(EngineDeadError(f"the engine stopped: {error}"))

    # ------------------------------------------------------------------ API
    def process(self, request_id: str, prompt: PromptType, params: SamplingParams | None, priority: int = 0,
                cache_salt: str = "", lora_request: LoRARequest | None = None) -> ProcessedRequest:
        """Validates and tokenizes (ValueError on bad input) without submitting."""
        return self.input_processor.process(request_id, prompt, params, priority=priority, cache_salt=cache_salt,
                                            lora_request=lora_request)

    def add_request(self, prompt: PromptType | ProcessedRequest, params: SamplingParams | None = None,
                    request_id: str | None = None, priority: int = 0, cache_salt: str = "",
                    lora_request: LoRARequest | None = None) -> asyncio.Queue:
        """Submits a request; its RequestOutputs (or an exception) arrive on the returned queue."""
        return self._submit(prompt, params, request_id, priority, cache_salt, lora_request).queue

    def _submit(self, prompt, params, request_id, priority, cache_salt, lora_request=None) -> _Pending:
        if self.dead_error is not None:
            raise EngineDeadError(f"the engine stopped: {self.dead_error}")
        if self._thread is None:
            raise EngineDeadError("the engine was shut down")
        if not self._started:
            self.start()
        if isinstance(prompt, ProcessedRequest):
            processed = prompt
        else:
            processed = self.process(request_id or f"req-{time.monotonic_ns()}", prompt, params, priority, cache_salt,
                                     lora_request)
        if processed.request_id in self._requests:
            raise ValueError(f"request id {processed.request_id!r} is already in use")
        pending = _Pending(asyncio.Queue(), processed,
                           RequestStats(time.monotonic()),
                           self.output_processor.sample_ids(processed))
        self.num_queued_requests += processed.num_samples
        self.num_queued_tokens += processed.num_prompt_tokens
        self._requests[processed.request_id] = pending
        self.output_processor.add_request(processed)
        self._inbox.put(("add", processed.samples))
        return pending

    def submit(self, prompt: PromptType | ProcessedRequest, params: SamplingParams | None = None,
               request_id: str | None = None, priority: int = 0, cache_salt: str = "",
               lora_request: LoRARequest | None = None) -> AsyncGenerator[RequestOutput, None]:
        """Submits the request now (synchronously: the queued load counts it at once) and returns
        the generator of its RequestOutputs; closing the generator aborts the request. A generator
        that is never iterated must be aborted with abort(request_id)."""
        return self._outputs(self._submit(prompt, params, request_id, priority, cache_salt, lora_request))

    async def generate(self, prompt: PromptType | ProcessedRequest, params: SamplingParams | None = None,
                       request_id: str | None = None, priority: int = 0, cache_salt: str = "",
                       lora_request: LoRARequest | None = None) -> AsyncIterator[RequestOutput]:
        """Yields the request's RequestOutputs until it finishes; closing or cancelling the
        generator aborts the request. lora_request: the LoRA adapter to run it with."""
        outputs = self.submit(prompt, params, request_id, priority, cache_salt, lora_request)
        async with contextlib.aclosing(outputs):
            async for out in outputs:
                yield out

    async def _outputs(self, pending: _Pending) -> AsyncGenerator[RequestOutput, None]:
        request_id = pending.processed.request_id
        finished = False
        try:
            while True:
                item = await pending.queue.get()
                if isinstance(item, BaseException):
                    raise item
                finished = item.finished
                if finished:
                    for listener in self.done_listeners:
                        listener(item, pending.stats, time.monotonic())
                yield item
                if finished:
                    return
        finally:
            self._forget(request_id)
            if not finished:
                self._abort_samples(pending.sample_ids)

    def abort(self, request_id: str) -> bool:
        """Aborts a request by the caller's id; False when it is not in flight."""
        pending = self._forget(request_id)
        if pending is None:
            return False
        self._abort_samples(pending.sample_ids)
        pending.queue.put_nowait(asyncio.CancelledError(f"request {request_id} was aborted"))
        return True

    def _abort_samples(self, sample_ids: list[str]) -> None:
        self.output_processor.abort(sample_ids)
        self._abort_in_engine(sample_ids)

    def _abort_in_engine(self, sample_ids: list[str]) -> None:
        self._inbox.put(("abort", list(sample_ids)))
