"""Decode steps replayed as CUDA graphs (the seed's capture_model, CUDAGraphWrapper and
_determine_batch_execution_and_padding, for one kind of graph).

At start-up the model's forward is captured once per decode batch size in capture_sizes()
(1, 2, 4, 8, 16, 24, 32, ... up to max_num_seqs), largest first, all in one memory pool: a smaller
graph reuses the larger ones' intermediate memory, as they never run at once. Each graph reads
its inputs from static device buffers (token ids, positions, slot mapping, block table, sequence
lengths) and writes its hidden states to a static output.

Each step, dispatch() picks the graph: a uniform-decode batch (one query token per request) of n
<= the largest size runs the smallest captured size >= n, padded; anything else (prefill, mixed
batches) runs eagerly. Padding rows write their K/V nowhere (slot -1), attend to one key of block
0 and are never read back. Replaying a graph gives the same result as running the same batch
eagerly: the same kernels, launched in the same order on the same shapes.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from corellm.model.attention_metadata import AttentionMetadata

logger = logging.getLogger("corellm")


def capture_sizes(max_num_seqs: int) -> list[int]:
    """Decode batch sizes to capture: 1, 2, 4, 8, then every multiple of 8 up to max_num_seqs,
    and max_num_seqs itself."""
    sizes = [s for s in (1, 2, 4, 8) if s <= max_num_seqs] + list(range(16, max_num_seqs + 1, 8))
    if sizes[-1] != max_num_seqs:
        sizes.append(max_num_seqs)
    return sizes


class CUDAGraphRunner:
    def __init__(self, model, kv_caches: list, max_num_seqs: int, max_model_len: int, block_size: int,
                 device: torch.device):
        self.model = model
        self.kv_caches = kv_caches
        self.device = device
        self.max_model_len = max_model_len  # the decode attention grid covers the longest sequence
        max_blocks_per_seq = (max_model_len + block_size - 1) // block_size
        self.sizes = capture_sizes(max_num_seqs)
        n = self.sizes[-1]
        i32 = dict(dtype=torch.int32, device=device)
        self.input_ids = torch.zeros(n, **i32)
        self.positions = torch.zeros(n, **i32)
        self.slot_mapping = torch.full((n,), -1, **i32)
        self.block_table = torch.zeros((n, max_blocks_per_seq), **i32)
        self.seq_lens = torch.ones(n, **i32)
        self.query_start_loc = torch.arange(n + 1, **i32)  # one query token per row, always
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None

    def _metadata(self, size: int) -> AttentionMetadata:
        return AttentionMetadata(slot_mapping=self.slot_mapping[:size], block_table=self.block_table[:size],
                                 seq_lens=self.seq_lens[:size], query_start_loc=self.query_start_loc[:size + 1],
                                 max_query_len=1, max_seq_len=self.max_model_len)

    def _forward(self, size: int) -> torch.Tensor:
        return self.model.forward(self.input_ids[:size], self.positions[:size], self._metadata(size), self.kv_caches)

    def capture(self) -> None:
        """Captures every size, largest first, into one pool (logged with the time it took)."""
        t0 = time.perf_counter()
        self.pool = torch.cuda.graph_pool_handle()
        with torch.inference_mode():
            for size in reversed(self.sizes):
                # A warm-up run first, on a side stream (lazy initialisation, library workspaces).
                side = torch.cuda.Stream(self.device)
                side.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(side):
                    self._forward(size)
                torch.cuda.current_stream(self.device).wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool):
                    self.outputs[size] = self._forward(size)
                self.graphs[size] = graph
        torch.cuda.synchronize(self.device)
        logger.info("captured %d CUDA graphs for decode batches of %d..%d in %.1f s", len(self.graphs),
                    self.sizes[0], self.sizes[-1], time.perf_counter() - t0)

    def dispatch(self, num_reqs: int, num_tokens: int) -> int | None:
        """The captured size that runs this batch, or None: run it eagerly."""
        if not self.graphs or num_reqs == 0 or num_tokens != num_reqs or num_reqs > self.sizes[-1]:
            return None
        return next(s for s in self.sizes if s >= num_reqs)

    def run(self, size: int, input_ids: np.ndarray, positions: np.ndarray, slot_mapping: np.ndarray,
            block_table: np.ndarray, seq_lens: np.ndarray) -> torch.Tensor:
        """Copies one decode batch (n <= size rows, the builder's arrays) into the static inputs,
        replays the size's graph and returns the n rows of hidden states (valid until the next
        replay)."""
        n = input_ids.shape[0]
        put = lambda dst, src: dst.copy_(torch.from_numpy(src), non_blocking=True)  # noqa: E731
        put(self.input_ids[:n], input_ids)
        put(self.positions[:n], positions)
        put(self.slot_mapping[:n], slot_mapping)
        put(self.block_table[:n, : block_table.shape[1]], block_table)
        put(self.seq_lens[:n], seq_lens)
        if size > n:  # padding rows: no K/V write, one key to attend to
            self.slot_mapping[n:size].fill_(-1)
            self.seq_lens[n:size].fill_(1)
        self.graphs[size].replay()
        return self.outputs[size][:n]

    def release(self) -> None:
        """Frees the graphs and their pool (at shutdown)."""
        self.graphs.clear()
        self.outputs.clear()
        self.pool = None
        torch.cuda.empty_cache()
