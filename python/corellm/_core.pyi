"""Type stubs of corellm._core, the native core (cpp/bindings/core_module.cpp)."""

from __future__ import annotations

import enum
from typing import Any, Sequence

import numpy as np
import numpy.typing as npt

_Ids = Sequence[int] | npt.NDArray[np.integer]

class RequestStatus(enum.Enum):
    WAITING = ...
    RUNNING = ...
    PREEMPTED = ...
    FINISHED_STOPPED = ...
    FINISHED_LENGTH_CAPPED = ...
    FINISHED_ABORTED = ...
    FINISHED_ERROR = ...
    FINISHED_REPETITION = ...

class FinishReason(enum.Enum):
    NONE = ...
    STOP = ...
    LENGTH = ...
    ABORT = ...
    ERROR = ...
    REPETITION = ...
    def __init__(self, value: int) -> None: ...

FINISH_REASON_NAMES: tuple[str | None, ...]  # by FinishReason value: None, "stop", "length", "abort", "error", "repetition"

class SchedulingPolicy(enum.Enum):
    FCFS = ...
    PRIORITY = ...

class PrefixHasher:
    def __init__(self, root: bytes = ...) -> None: ...
    @property
    def root(self) -> bytes: ...
    def hash_block(self, parent: bytes, token_ids: _Ids, extra_keys: str = "") -> bytes: ...

class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def num_free_blocks(self) -> int: ...
    @property
    def usage(self) -> float: ...
    def get_new_blocks(self, n: int) -> list[int] | None: ...
    def touch(self, block_ids: _Ids) -> None: ...
    def free_blocks(self, block_ids: _Ids) -> None: ...
    def cache_block(self, block_id: int, hash: bytes) -> None: ...
    def get_cached_block(self, hash: bytes) -> int | None: ...
    def ref_cnt(self, block_id: int) -> int: ...
    def reset_prefix_cache(self) -> bool: ...
    def check_integrity(self) -> None: ...

class SchedulerConfig:
    def __init__(
        self,
        *,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int = 2048,
        max_model_len: int = 2048,
        block_size: int = 16,
        num_blocks: int,
        long_prefill_token_threshold: int = 0,
        enable_prefix_caching: bool = True,
        enable_chunked_prefill: bool = True,
        scheduling_policy: SchedulingPolicy = ...,
        num_speculative_tokens: int = 0,
        prompt_lookup_min: int = 0,
        prompt_lookup_max: int = 0,
        num_lookahead_tokens: int = 0,
    ) -> None: ...
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    block_size: int
    num_blocks: int
    long_prefill_token_threshold: int
    enable_prefix_caching: bool
    enable_chunked_prefill: bool
    scheduling_policy: SchedulingPolicy
    num_speculative_tokens: int  # draft tokens verified per request per step at most (0: off)
    prompt_lookup_min: int  # the n-gram proposer's (prompt_lookup_max 0: drafts from set_draft_token_ids)
    prompt_lookup_max: int
    num_lookahead_tokens: int  # KV slots past each scheduled request's tokens (a draft model's)

class NewRequestData:
    req_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    block_ids: list[int]
    num_computed_tokens: int
    batch_row: int
    payload: Any

class CachedRequestData:
    req_ids: list[str]
    new_block_ids: list[list[int]]
    num_computed_tokens: list[int]
    batch_rows: list[int]

class SchedulerOutput:
    step_id: int
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    req_ids: list[str]
    num_scheduled_tokens: npt.NDArray[np.int32]
    num_computed_tokens: npt.NDArray[np.int32]
    batch_rows: npt.NDArray[np.int32]
    samples_token: npt.NDArray[np.bool_]
    uses_grammar: npt.NDArray[np.bool_]  # samples this step under a grammar (structured output)
    num_draft_tokens: npt.NDArray[np.int32]  # per request: drafts verified this step
    draft_token_ids: npt.NDArray[np.int32]  # the drafts, flat in batch order
    total_num_scheduled_tokens: int
    finished_req_ids: list[str]
    preempted_req_ids: list[str]
    num_reqs: int
    def __len__(self) -> int: ...

class SchedulerStats:
    def __init__(self) -> None: ...
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    num_preemptions: int
    num_free_blocks: int

class SpecDecodingStats:
    def __init__(self) -> None: ...
    num_drafts: int  # requests that verified drafts this step
    num_draft_tokens: int
    num_accepted_tokens: int
    num_draft_tokens_per_pos: list[int]
    num_accepted_tokens_per_pos: list[int]

class SchedulerUpdate:
    step_id: int
    req_ids: list[str]
    num_new_tokens: npt.NDArray[np.int32]  # per request: its run of new_token_ids
    new_token_ids: npt.NDArray[np.int32]  # flat
    finish_reasons: npt.NDArray[np.uint8]  # FinishReason values: index FINISH_REASON_NAMES
    stop_reasons: npt.NDArray[np.int32]
    num_cached_tokens: npt.NDArray[np.int32]
    scheduler_stats: SchedulerStats
    spec_decoding_stats: SpecDecodingStats
    def __len__(self) -> int: ...

def propose_ngram_drafts(
    token_ids: _Ids, *, prompt_lookup_min: int, prompt_lookup_max: int, max_drafts: int
) -> list[int]: ...

class Scheduler:
    def __init__(self, config: SchedulerConfig, hasher: PrefixHasher | None = None) -> None: ...
    @property
    def config(self) -> SchedulerConfig: ...
    def add_request(
        self,
        request_id: str,
        prompt_token_ids: _Ids,
        *,
        max_tokens: int,
        min_tokens: int = 0,
        ignore_eos: bool = False,
        eos_token_id: int = -1,
        stop_token_ids: _Ids = (),
        repetition_detection: tuple[int, int, int] | None = None,  # (max_pattern_size, min_pattern_size, min_count)
        priority: int = 0,
        arrival_time: float = 0.0,
        cache_salt: str = "",
        mm_ranges: list[tuple[int, int, str]] = ...,
        use_structured_output: bool = False,
        prediction_token_ids: _Ids = (),
        payload: Any = None,
    ) -> None: ...
    def schedule(self) -> SchedulerOutput: ...
    def update_from_output(
        self, scheduler_output: SchedulerOutput, sampled_token_ids: _Ids | npt.NDArray[np.int32]
    ) -> SchedulerUpdate: ...  # [num_reqs] or [num_reqs, width], -1 after each row's last token
    def set_draft_token_ids(self, request_id: str, draft_token_ids: _Ids) -> None: ...
    def set_step_cost(self, fixed_seconds: float, per_token_seconds: float) -> None: ...
    def finish_requests(self, request_ids: list[str], status: RequestStatus) -> int: ...
    def has_unfinished_requests(self) -> bool: ...
    @property
    def num_unfinished_requests(self) -> int: ...
    @property
    def num_waiting(self) -> int: ...
    @property
    def num_running(self) -> int: ...
    @property
    def num_free_blocks(self) -> int: ...
    @property
    def num_blocks(self) -> int: ...
    def stats(self) -> SchedulerStats: ...
    def get_request(self, request_id: str) -> dict[str, Any] | None: ...
    def reset_prefix_cache(self) -> bool: ...
    def check_integrity(self) -> None: ...

class BatchBuilder:
    def __init__(
        self, *, max_num_reqs: int, max_model_len: int, block_size: int, max_num_batched_tokens: int
    ) -> None: ...
    @property
    def max_num_blocks_per_req(self) -> int: ...
    def update_states(self, scheduler_output: SchedulerOutput) -> None: ...
    def prepare_inputs(self, scheduler_output: SchedulerOutput) -> None: ...
    def record_sampled(
        self, scheduler_output: SchedulerOutput, sampled_token_ids: _Ids | npt.NDArray[np.int32]
    ) -> None: ...
    num_tokens: int
    num_reqs: int
    max_query_len: int
    max_seq_len: int
    num_logits: int  # logits rows: one per request, d + 1 for a request verifying d drafts
    input_ids: npt.NDArray[np.int32]
    positions: npt.NDArray[np.int32]
    slot_mapping: npt.NDArray[np.int32]
    query_start_loc: npt.NDArray[np.int32]
    seq_lens: npt.NDArray[np.int32]
    logits_indices: npt.NDArray[np.int32]
    block_table: npt.NDArray[np.int32]
    def row_token_ids(self, row: int) -> list[int]: ...
    def row_block_ids(self, row: int) -> list[int]: ...

class ShmBroadcast:
    """Messages from one writer to num_readers readers on this machine, through shared memory."""

    @staticmethod
    def create(name: str, num_readers: int, num_slots: int, slot_bytes: int) -> ShmBroadcast: ...
    @staticmethod
    def attach(name: str, reader: int) -> ShmBroadcast: ...
    def unlink_name(self) -> None: ...
    def publish(self, data: Any, timeout_s: float) -> bool: ...  # a buffer, or a list of buffers
    def receive(self, timeout_s: float) -> npt.NDArray[np.uint8] | None: ...
    @property
    def slot_capacity(self) -> int: ...
    @property
    def num_readers(self) -> int: ...
    @property
    def name(self) -> str: ...

class ShmAllReduce:
    """The sum of a CPU tensor over the tensor-parallel ranks on this machine, through shared memory."""

    @staticmethod
    def create(name: str, size: int, buffer_bytes: int) -> ShmAllReduce: ...
    @staticmethod
    def attach(name: str, rank: int) -> ShmAllReduce: ...
    def unlink_name(self) -> None: ...
    def all_reduce(self, data: int, count: int, dtype: int, timeout_s: float) -> None: ...
    @property
    def rank(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def name(self) -> str: ...

# Submodules, typed loosely: they take raw addresses (use corellm.ops and corellm.model instead).
kernels: Any  # the CPU kernels, their SamplingBatch and RejectionBatch (cpp/bindings/kernel_bindings.cpp)
model: Any  # the native decoder stack: DecoderDims, DecoderLayerWeights, KVCacheShape, DecoderStack
