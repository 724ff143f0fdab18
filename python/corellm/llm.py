"""LLM: offline batched generation, shaped like vLLM's: LLM(model).generate(prompts, params).

Under torchrun (`torchrun --nproc-per-node N script.py`, tensor_parallel_size=N) every rank runs the
script: rank 0 holds the engine and the other ranks its workers (WorkerLoop), and each call of
generate / chat / shutdown, made by every rank with the same arguments, runs on rank 0 while the
others run their shares of its steps; rank 0's result (or its error) is then returned on every rank."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import pickle
import time
from collections.abc import Sequence
from typing import Any

from corellm.beam_search import BeamSearch, BeamSearchOutput, BeamSearchParams
from corellm.config import EngineConfig, SpeculativeConfig
from corellm.distributed.torchrun import TorchrunPlace
from corellm.distributed.spawned_processes import refuse_while_importing_main
from corellm.engine.data_parallel_replicas import DataParallelReplicas
from corellm.engine.engine_parts import EngineParts
from corellm.inputs import PromptType, TokensPrompt
from corellm.lora.lora_request import LoRARequest
from corellm.model.loader import LoadedModel
from corellm.outputs import (ClassificationOutput, ClassificationRequestOutput, EmbeddingOutput, EmbeddingRequestOutput,
                             RequestOutput, ScoringOutput, ScoringRequestOutput)
from corellm.pooling_params import PoolingParams
from corellm.sampling_params import RequestOutputKind, SamplingParams
from corellm.scoring import cosine_scores, cross_encoder_inputs, pair_up
from corellm.tokenizer import CHAT_TEMPLATE_PARAMETERS, Tokenizer
from corellm.worker.tp_workers import TensorParallelWorkers, WorkerLoop

logger = logging.getLogger("corellm")

class LLM:
    def __init__(self, model: str | None = None, *, dtype: str = "auto", quantization: str | None = None,
                 device: str = "cpu",
                 enforce_eager: bool = False, max_model_len: int | None = None, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 2048,
                 block_size: int = 16, enable_prefix_caching: bool = True,
                 kv_cache_memory: int | float | None = None, kv_cache_dtype: str = "auto", seed: int = 0,
                 long_prefill_token_threshold: int = 0,
                 scheduling_policy: str = "fcfs", speculative_config: dict | SpeculativeConfig | None = None,
                 limit_mm_per_prompt: dict | None = None, allowed_media_domains: tuple[str, ...] = (),
                 tensor_parallel_size: int = 1, nnodes: int = 1, node_rank: int = 0, master_addr: str = "127.0.0.1",
                 master_port: int = 0, disable_custom_all_reduce: bool = False, data_parallel_size: int = 1,
                 reasoning_parser: str | None = None, pooling_type: str | None = None,
                 generation_config: str = "auto", override_generation_config: dict | None = None,
                 stream_interval: int = 1, enable_lora: bool = False, max_loras: int = 4, max_lora_rank: int = 16,
                 hf_overrides: dict | None = None, loaded_model: LoadedModel | None = None):
        """quantization: "gguf" (a GGUF file's quantized weights computed as they are; the default for
        a .gguf on the CPU), "int8" (an HF checkpoint's projections quantized to int8 at load: W8A8
        on the CPU or a Hopper GPU), "fp8" (the projections in fp8 e4m3 on a Hopper GPU), "mxfp4" (an
        MXFP4 checkpoint's MXFP4 weights computed as they are: gpt-oss's experts; the default for one
        on the CPU) or "none" (weights in dtype).
        kv_cache_dtype: the KV cache's element type, as vLLM's: "auto" the model's dtype; "fp8" (=
        "fp8_e4m3") or "fp8_e5m2", an 8-bit float, half the bytes per token (CPU, bfloat16 models).
        speculative_config: speculative decoding, as vLLM names it (see SpeculativeConfig), e.g.
        {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}.
        reasoning_parser: a reasoning model's format ("deepseek_r1" or "qwen3", as the server's
        --reasoning-parser): structured output applies to the answer after its <think> block, and
        SamplingParams.thinking_token_budget bounds the block; "openai_gptoss" (gpt-oss's harmony
        messages) takes neither yet.
        pooling_type: how embed() pools the prompt's hidden states ("LAST", "MEAN", "CLS"; default:
        the model's sentence-transformers pooling config, else LAST).
        generation_config: where the sampling defaults of get_default_sampling_params() (and of
        generate() without sampling params) come from, as vLLM's: "auto" the model's
        generation_config.json, "vllm" none, or a folder holding a generation_config.json;
        override_generation_config: defaults set over those, e.g. {"temperature": 0.5}.
        limit_mm_per_prompt: a LLaVA model's images per prompt at most ({"image": N}; default 1);
        allowed_media_domains: the hosts whose image URLs may be fetched (default none).
        tensor_parallel_size: the model split over this many processes (heads, intermediate rows
        and vocabulary divided; gloo on the CPU, NCCL on CUDA); nnodes > 1: its ranks on several
        machines, meeting at master_addr:master_port (this one is node 0; the others run
        `corellm serve MODEL --headless --node-rank K ...`). On one machine the CPU ranks' all-reduces go
        through shared memory; disable_custom_all_reduce=True: through gloo.
        data_parallel_size: replicas of the whole engine, each a process with the same arguments, its
        own KV cache and a share of the cores (engine/data_parallel_replicas.py), each
        tensor-parallel itself with tensor_parallel_size > 1 (its ranks splitting its share of
        the cores); generate() gives each a contiguous share of the prompts. get_metrics() counts
        this process's replica.
        enable_lora: requests may run with LoRA adapters (generate's lora_request), max_loras of them
        held at once (a step mixes any of those and the base model), each of rank max_lora_rank at
        most (vLLM's names; its default max_loras is 1).
        hf_overrides: fields set over the model directory's config.json before it is read
        (vLLM's), e.g. a causal reranker loaded as a cross-encoder: {"architectures":
        ["Qwen3ForSequenceClassification"], "classifier_from_token": ["no", "yes"],
        "is_original_qwen3_reranker": True}.
        stream_interval: EngineConfig's, for streamed outputs (AsyncLLM, the server); LLM returns
        whole outputs, so anything but 1 is a ValueError rather than a setting that does nothing."""
        arguments = dict(locals())  # first: the parameters as given, for the data-parallel replicas
        del arguments["self"], arguments["data_parallel_size"]
        refuse_while_importing_main("LLM")
        if stream_interval != 1:
            raise ValueError(f"stream_interval ({stream_interval!r}) applies to streamed outputs (AsyncLLM, corellm "
                             f"serve --stream-interval); LLM's generate returns whole outputs")
        if not isinstance(data_parallel_size, int) or data_parallel_size < 1:
            raise ValueError(f"data_parallel_size must be an integer >= 1, got {data_parallel_size!r}")
        if data_parallel_size > 1 and loaded_model is not None:
            raise ValueError("data_parallel_size > 1 is not supported with a loaded_model (each replica loads "
                             "the model from its path)")
        if data_parallel_size > 1 and tensor_parallel_size > 1 and (nnodes > 1 or master_port):
            raise ValueError("data_parallel_size > 1 with tensor-parallel replicas runs them on this machine: "
                             "nnodes must be 1 and master_port 0 (each replica's ranks meet at a free port "
                             f"of their own), got nnodes={nnodes}, master_port={master_port}")
        torchrun = TorchrunPlace.from_environment()
        if torchrun is not None:
            if tensor_parallel_size != torchrun.world_size:
                raise ValueError(f"under torchrun, tensor_parallel_size ({tensor_parallel_size}) must equal its world "
                                 f"size ({torchrun.world_size}: --nnodes x --nproc-per-node)")
            if data_parallel_size > 1 or loaded_model is not None or (nnodes, node_rank) != (1, 0):
                raise ValueError("under torchrun, every process is a tensor-parallel rank: data_parallel_size, "
                                 "loaded_model, nnodes and node_rank do not apply (torchrun places the ranks)")
            nnodes, node_rank = torchrun.nnodes, torchrun.node_rank
        self.config = EngineConfig(model=model, hf_overrides=hf_overrides, dtype=dtype, quantization=quantization,
                                   device=device, enforce_eager=enforce_eager,
                                   max_model_len=max_model_len,
                                   max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                                   block_size=block_size, enable_prefix_caching=enable_prefix_caching,
                                   kv_cache_memory=kv_cache_memory, kv_cache_dtype=kv_cache_dtype, seed=seed,
                                   long_prefill_token_threshold=long_prefill_token_threshold,
                                   scheduling_policy=scheduling_policy, speculative_config=speculative_config,
                                   limit_mm_per_prompt=limit_mm_per_prompt,
                                   allowed_media_domains=allowed_media_domains,
                                   tensor_parallel_size=tensor_parallel_size, nnodes=nnodes, node_rank=node_rank,
                                   master_addr=master_addr, master_port=master_port,
                                   disable_custom_all_reduce=disable_custom_all_reduce,
                                   reasoning_parser=reasoning_parser, pooling_type=pooling_type,
                                   generation_config=generation_config,
                                   override_generation_config=override_generation_config,
                                   enable_lora=enable_lora, max_loras=max_loras, max_lora_rank=max_lora_rank,
                                   torchrun=torchrun is not None)
        # Under torchrun: on rank 0 the workers to send results to; on the others this rank's loop.
        self._torchrun_workers: TensorParallelWorkers | None = None
        self._follower: WorkerLoop | None = None
        if torchrun is not None and torchrun.rank > 0:
            self._follower = WorkerLoop(torchrun.rank, TensorParallelWorkers.spec_for(self.config))
            self.loaded, self.engine_core, self._replicas, self.data_parallel_size = self._follower.loaded, None, None, 1
            self._await_rank0()  # rank 0's start-up: its KV cache set-up and memory calls
            return
        t0 = time.perf_counter()
        self._replicas = DataParallelReplicas(arguments, data_parallel_size) if data_parallel_size > 1 else None
        self.data_parallel_size = data_parallel_size
        try:
            self.parts = EngineParts.build(self.config, loaded_model)
        except BaseException:
            if self._replicas is not None:
                self._replicas.shutdown()
            raise
        self.loaded, self.engine_core = self.parts.loaded, self.parts.engine_core
        self.input_processor, self.output_processor = self.parts.input_processor, self.parts.output_processor
        logger.info("started %s (%s) in %.1f s", self.loaded.name, self.loaded.model.dtype, time.perf_counter() - t0)
        self._ids = itertools.count()
        if torchrun is not None:
            self._torchrun_workers = self.engine_core.model_runner.tp_workers
            self._torchrun_workers.send_result(("ok", None))

    # ------------------------------------------------------------------ torchrun
    def _await_rank0(self):
        """A rank other than 0: runs rank 0's steps until it sends the result of the call every rank
        is making, and returns that result (raises rank 0's error as a RuntimeError)."""
        data = self._follower.run()
        if data is None:
            raise RuntimeError(f"rank {self._follower.rank}: rank 0 shut the engine down")
        kind, value = pickle.loads(data)
        if kind == "error":
            raise RuntimeError(f"rank 0: {value}")
        return value

    def _on_every_rank(self, call):
        """Runs call() here, on rank 0 (or anywhere torchrun is not), and under torchrun sends its
        result or its error to the other ranks, which run `call`'s steps meanwhile."""
        if self._follower is not None:
            return self._await_rank0()
        if self._torchrun_workers is None:
            return call()
        try:
            result = call()
        except BaseException as e:
            self._torchrun_workers.send_result(("error", f"{type(e).__name__}: {e}"))
            raise
        self._torchrun_workers.send_result(("ok", result))
        return result

    def _engine_here(self, what: str) -> None:
        if self._follower is not None:
            raise RuntimeError(f"{what}: under torchrun the engine is on rank 0; rank {self._follower.rank} runs "
                               f"generate, chat and shutdown with it")

    @property
    def max_model_len(self) -> int:
        self._engine_here("max_model_len")
        return self.engine_core.max_model_len

    def shutdown(self) -> None:
        """Releases the engine's CUDA graphs now rather than at exit, and stops the data-parallel
        replicas and the workers (the LLM is unusable after; under torchrun every rank calls it)."""
        if self._follower is not None:
            if not self._follower.stopped and self._follower.run() is not None:
                raise RuntimeError(f"rank {self._follower.rank}: shutdown while rank 0 answered another call")
            self._follower.close()
            return
        self.engine_core.shutdown()
        if self._replicas is not None:
            self._replicas.shutdown()
            self._replicas = None

    def get_metrics(self) -> dict[str, int | float | list[int]]:
        """The engine's counters since it started, by their Prometheus names: prefix-cache queries
        and hits, preemptions and, with speculative decoding, drafts and accepted drafts (in all
        and per draft position)."""
        self._engine_here("get_metrics")
        s = self.engine_core.stats()
        metrics: dict[str, int | float | list[int]] = {
            "corellm:prefix_cache_queries": s.prefix_cache_queries, "corellm:prefix_cache_hits": s.prefix_cache_hits,
            "corellm:num_preemptions": s.num_preemptions, "corellm:kv_cache_usage_perc": s.kv_cache_usage}
        if self.engine_core.speculative:
            metrics.update(self.engine_core.spec_totals.as_metrics())
        return metrics

    def get_tokenizer(self) -> Tokenizer:
        return self.loaded.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's generation_config.json defaults (vLLM's behaviour)."""
        self._engine_here("get_default_sampling_params")
        return SamplingParams(**self.parts.sampling_defaults)

    # ------------------------------------------------------------------ generate
    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True, priority: Sequence[int] | None = None,
                 lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order. priority: one per prompt (lower runs first),
        with scheduling_policy="priority". lora_request: the LoRA adapter every prompt runs with, or
        one per prompt (None: the base model); the engine needs enable_lora."""
        return self._on_every_rank(lambda: self._generate(prompts, sampling_params, use_tqdm, priority, lora_request))

    def embed(self, prompts: PromptType | Sequence[PromptType], pooling_params: PoolingParams | None = None,
              use_tqdm: bool = True, lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
              ) -> list[EmbeddingRequestOutput]:
        """One vector per prompt, in order (vLLM's embed): the prompt's final hidden states pooled
        by the engine's pooling_type (LAST, MEAN or CLS: the model's sentence-transformers config,
        else LAST), L2-normalized unless pooling_params.normalize is False. lora_request: the LoRA
        adapter every prompt runs with, or one per prompt. With data_parallel_size > 1 this process
        computes them all."""
        return self._on_every_rank(lambda: self._embed(prompts, pooling_params or PoolingParams(), use_tqdm,
                                                       lora_request))

    def _embed(self, prompts, params: PoolingParams, use_tqdm: bool,
               lora_request=None) -> list[EmbeddingRequestOutput]:
        prompts = [prompts] if isinstance(prompts, (str, dict)) else list(prompts)
        loras = _per_prompt("LoRA requests", lora_request, len(prompts))
        processed = [self.input_processor.process(str(next(self._ids)), prompt, params, lora_request=lora)
                     for prompt, lora in zip(prompts, loras)]
        results = []
        for out in self._run(processed, use_tqdm):
            if out.embedding is None:
                raise RuntimeError(f"request {out.request_id} failed: {out.metrics.get('error', 'no vector made')}")
            results.append(EmbeddingRequestOutput(out.request_id, out.prompt_token_ids, EmbeddingOutput(out.embedding)))
        return results

    def classify(self, prompts: PromptType | Sequence[PromptType], pooling_params: PoolingParams | None = None,
                 use_tqdm: bool = True, lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
                 ) -> list[ClassificationRequestOutput]:
        """vLLM's LLM.classify, with a sequence classifier (a *ForSequenceClassification model):
        per prompt the probabilities of the model's labels (`.outputs.probs`, in id order: a
        softmax over them, or one sigmoid for a one-label model; the logits with
        PoolingParams(use_activation=False)). The labels' names: `.labels`. lora_request: as embed's."""
        params = dataclasses.replace(pooling_params or PoolingParams(), task="classify")
        return self._on_every_rank(lambda: self._classify(prompts, params, use_tqdm, lora_request))

    def _classify(self, prompts, params: PoolingParams, use_tqdm: bool,
                  lora_request=None) -> list[ClassificationRequestOutput]:
        return [ClassificationRequestOutput(o.request_id, o.prompt_token_ids, ClassificationOutput(o.outputs.embedding))
                for o in self._embed(prompts, params, use_tqdm, lora_request)]

    @property
    def labels(self) -> tuple[str, ...]:
        """A sequence classifier's labels, in id order (its config's id2label); (): not a classifier."""
        return self.loaded.config.classifier_labels

    def score(self, data_1: PromptType | Sequence[PromptType], data_2: PromptType | Sequence[PromptType],
              use_tqdm: bool = True, lora_request: LoRARequest | None = None) -> list[ScoringRequestOutput]:
        """vLLM's LLM.score. With an embedding model (a bi-encoder): per pair the cosine similarity
        of the two prompts' vectors (`embed`'s, L2-normalized), each distinct prompt embedded once.
        With a one-label sequence classifier (a cross-encoder): per pair the classifier's sigmoid
        on the two texts encoded together (the tokenizer's pair encoding, its separators included).
        One of data_1 against each of data_2, or as many of each, scored pairwise (scoring.py).
        lora_request: the LoRA adapter every prompt runs with."""
        if lora_request is not None and not isinstance(lora_request, LoRARequest):
            raise ValueError(f"score's lora_request is one LoRARequest for every pair, got "
                             f"{type(lora_request).__name__}")
        return self._on_every_rank(lambda: self._score(data_1, data_2, use_tqdm, lora_request))

    def _score(self, data_1, data_2, use_tqdm: bool, lora_request: LoRARequest | None) -> list[ScoringRequestOutput]:
        first, second = pair_up(*([d] if isinstance(d, (str, dict)) else list(d) for d in (data_1, data_2)))
        if self.labels:
            pairs = cross_encoder_inputs(self.get_tokenizer(), self.labels, first, second,
                                         token_types=self.loaded.config.type_vocab_size > 1)
            return [ScoringRequestOutput(o.request_id, o.prompt_token_ids, ScoringOutput(o.outputs.probs[0]))
                    for o in self._classify(pairs, PoolingParams(task="classify"), use_tqdm, lora_request)]
        distinct: dict[object, PromptType] = {}
        for prompt in first + second:
            distinct.setdefault(_prompt_key(prompt), prompt)
        vectors = dict(zip(distinct, self._embed(list(distinct.values()), PoolingParams(normalize=True), use_tqdm,
                                                 lora_request)))
        pairs = [(vectors[_prompt_key(a)], vectors[_prompt_key(b)]) for a, b in zip(first, second)]
        scores = cosine_scores([a.outputs.embedding for a, _ in pairs], [b.outputs.embedding for _, b in pairs])
        return [ScoringRequestOutput(f"{a.request_id}-{b.request_id}", a.prompt_token_ids + b.prompt_token_ids,
                                     ScoringOutput(s)) for (a, b), s in zip(pairs, scores)]

    def _generate(self, prompts, sampling_params, use_tqdm: bool, priority, lora_request=None) -> list[RequestOutput]:
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        prompts = list(prompts)
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        if isinstance(sampling_params, SamplingParams):
            params = [sampling_params] * len(prompts)
        else:
            params = list(sampling_params)
            if len(params) != len(prompts):
                raise ValueError(f"got {len(params)} sampling params for {len(prompts)} prompts")
        priorities = [0] * len(prompts) if priority is None else list(priority)
        if len(priorities) != len(prompts):
            raise ValueError(f"got {len(priorities)} priorities for {len(prompts)} prompts")
        loras = _per_prompt("LoRA requests", lora_request, len(prompts))
        # Validate and tokenize everything before any request enters the engine.
        processed = []
        for prompt, p, prio, lora in zip(prompts, params, priorities, loras):
            p = p.clone()
            p.output_kind = RequestOutputKind.FINAL_ONLY
            processed.append(self.input_processor.process(str(next(self._ids)), prompt, p, priority=prio,
                                                          lora_request=lora))
        if self._replicas is None:
            return self._run(processed, use_tqdm)
        # Data parallel: replica r takes prompts bounds[r] .. bounds[r+1]-1; this process the first share.
        n = self.data_parallel_size
        bounds = [len(prompts) * r // n for r in range(n + 1)]
        for r in range(1, n):
            share = slice(bounds[r], bounds[r + 1])
            self._replicas.submit(r, prompts[share], params[share], priorities[share], loras[share])
        outputs, failure = [], None
        try:
            outputs = self._run(processed[:bounds[1]], use_tqdm)
        except BaseException as e:  # the replicas' answers are still collected: the next call starts clean
            failure = e
        for r in range(1, n):
            try:
                got = self._replicas.result(r)
            except RuntimeError as e:
                failure = failure or e
                continue
            for out, req in zip(got, processed[bounds[r]:bounds[r + 1]]):
                out.request_id = req.request_id  # ids unique across the replicas
            outputs += got
        if failure is not None:
            raise failure
        return outputs

    def _run(self, processed, use_tqdm: bool) -> list[RequestOutput]:
        """Adds the processed requests to the engine and steps it until they are all finished."""
        from tqdm import tqdm

        for req in processed:
            self.output_processor.add_request(req)
            for sample in req.samples:
                self.engine_core.add_request(sample)

        order = {req.request_id: i for i, req in enumerate(processed)}
        results: list[RequestOutput | None] = [None] * len(processed)
        bar = tqdm(total=len(processed), desc="Processed prompts", unit="req", disable=not use_tqdm, dynamic_ncols=True)
        out_tokens, t0 = 0, time.perf_counter()
        try:
            while self.output_processor.has_unfinished_requests():
                step = self.engine_core.step()
                outputs, to_abort = self.output_processor.process_outputs(step.outputs)
                if to_abort:
                    self.engine_core.abort_requests(to_abort)
                out_tokens += sum(len(o.new_token_ids) for o in step.outputs)
                for out in outputs:
                    if out.finished:
                        results[order[out.request_id]] = out
                        bar.update(1)
                if use_tqdm:
                    bar.set_postfix_str(f"output {out_tokens / max(time.perf_counter() - t0, 1e-9):.1f} tok/s")
                if not step.outputs and not self.engine_core.has_unfinished_requests():
                    break  # everything left was aborted
        finally:
            bar.close()
        return [r for r in results if r is not None]

    def beam_search(self, prompts: PromptType | Sequence[PromptType], params: BeamSearchParams,
                    use_tqdm: bool = False,
                    lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None) -> list[BeamSearchOutput]:
        """vLLM's LLM.beam_search: per prompt the params.beam_width best sequences (beam_search.py
        states the algorithm), each with its tokens (the prompt's first), text (the whole
        sequence's, as vLLM's), cumulative logprob and per-token top logprobs. Every prompt's beams
        go to the engine together, one token each per round. lora_request: as generate's."""
        return self._on_every_rank(lambda: self._beam_search(prompts, params, use_tqdm, lora_request))

    def _beam_search(self, prompts, params: BeamSearchParams, use_tqdm: bool,
                     lora_request=None) -> list[BeamSearchOutput]:
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        loras = _per_prompt("LoRA requests", lora_request, len(prompts))
        if not isinstance(params, BeamSearchParams):
            raise ValueError(f"beam_search takes a BeamSearchParams, got {type(params).__name__}")
        tok = self.loaded.tokenizer
        searches = []
        for prompt in prompts:
            if isinstance(prompt, dict) and prompt.get("multi_modal_data") is not None:
                raise ValueError("beam_search takes text prompts (no multi_modal_data)")
            _, ids = self.input_processor.tokenize(prompt)
            if not ids or len(ids) >= self.max_model_len:
                raise ValueError(f"a beam search prompt needs 1 to {self.max_model_len - 1} tokens, got {len(ids)}")
            searches.append(BeamSearch(ids, params, tok.eos_token_id, self.max_model_len))
        step = params.step_params()
        while any(beams := [search.prompts() for search in searches]):
            outputs = self._generate([{"prompt_token_ids": tokens} for each in beams for tokens in each], step,
                                     use_tqdm, None, [lora for lora, each in zip(loras, beams) for _ in each])
            at = 0
            for search, each in zip(searches, beams):
                search.advance(outputs[at:at + len(each)])
                at += len(each)
        results = []
        for search in searches:
            best = search.best()
            for beam in best:
                beam.text = tok.decode(beam.tokens)
            results.append(BeamSearchOutput(best))
        return results

    def chat(self, messages: list[dict[str, Any]] | list[list[dict[str, Any]]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None, use_tqdm: bool = True,
             chat_template: str | None = None, add_generation_prompt: bool = True,
             continue_final_message: bool = False, tools: list[dict[str, Any]] | None = None,
             chat_template_kwargs: dict[str, Any] | None = None,
             lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None) -> list[RequestOutput]:
        """Renders each conversation with the model's chat template (jinja2 sandbox), then generates.
        tools (OpenAI's format) and chat_template_kwargs reach the template; continue_final_message
        leaves the last message open for the model to continue (then add_generation_prompt must be
        False). As in vLLM's offline chat, calls are not parsed out of the text."""
        if self._follower is not None:  # rank 0 renders and runs the conversations
            return self._await_rank0()
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        tok = self.loaded.tokenizer
        extra = dict(chat_template_kwargs or {})
        for reserved in sorted(extra.keys() & (CHAT_TEMPLATE_PARAMETERS | ({"tools"} if tools is not None else set()))):
            raise ValueError(f"chat_template_kwargs may not set {reserved!r}")
        if tools is not None:
            extra["tools"] = tools
        prompts = []
        for conv in conversations:
            text = tok.apply_chat_template(conv, add_generation_prompt=add_generation_prompt,
                                           chat_template=chat_template,
                                           continue_final_message=continue_final_message, **extra)
            # The template writes the special tokens itself: do not add a BOS again.
            prompts.append({"prompt": text, "prompt_token_ids": tok.encode(text, add_special_tokens=False)})
        return self.generate(prompts, sampling_params, use_tqdm, lora_request=lora_request)


def _per_prompt(what: str, value: LoRARequest | Sequence | None, count: int) -> list:
    """One value for every prompt (None or a single LoRARequest), or a sequence of one per prompt
    (ValueError naming `what` when the counts differ)."""
    if value is None or isinstance(value, LoRARequest):
        return [value] * count
    values = list(value)
    if len(values) != count:
        raise ValueError(f"got {len(values)} {what} for {count} prompts")
    return values


def _prompt_key(prompt: PromptType) -> object:
    """The same text or the same token ids: one key (LLM.score embeds each once); any other dict
    prompt (images, a salt) is its own."""
    if isinstance(prompt, str):
        return ("text", prompt)
    if isinstance(prompt, dict) and set(prompt) <= {"prompt", "prompt_token_ids"}:
        ids = prompt.get("prompt_token_ids")
        key = ("ids", tuple(ids)) if isinstance(ids, (list, tuple)) else ("text", prompt.get("prompt"))
        try:
            hash(key)
            return key
        except TypeError:  # not ids nor text: the embedding's own check names what is wrong
            pass
    return ("object", id(prompt))
