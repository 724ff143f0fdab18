"""The CPU KV cache's memory is committed without start-up waiting for it: allocate_kv_caches
returns at once, a background thread faults every page in (the resident size grows by the whole
cache), and what the engine writes meanwhile is kept (the kernel populates pages without
touching their contents)."""

from __future__ import annotations

import threading

import torch

from corellm.model.model_config import ModelConfig
from corellm.worker.kv_cache import allocate_kv_caches


def _resident_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def _commit_thread() -> threading.Thread | None:
    return next((t for t in threading.enumerate() if t.name == "corellm-kv-commit"), None)


def test_the_cache_is_committed_in_the_background_and_writes_meanwhile_are_kept():
    config = ModelConfig(architecture="LlamaForCausalLM", vocab_size=64, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                         rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=512,
                         tie_word_embeddings=True)
    # 2 layers x (K, V) x 16384 blocks x 2 heads x 64 x 16 x 2 bytes: 64 MiB a tensor, more than
    # glibc's largest threshold for serving an allocation from the heap, so each is fresh memory
    # (not pages an earlier test already made resident) and the resident size shows the commit.
    num_blocks, block_size = 16384, 16
    before = _resident_bytes()
    caches = allocate_kv_caches(config, num_blocks, block_size, torch.bfloat16, torch.device("cpu"))
    for i, (k, v) in enumerate(caches):  # the engine's first writes, racing the commit
        k.view(-1)[::32768] = i + 1
        v.view(-1)[-1] = -(i + 1)
    committer = _commit_thread()
    if committer is not None:  # None: it already finished, or this kernel zeroed synchronously
        committer.join(timeout=30)
        assert not committer.is_alive()
    cache_bytes = sum(t.numel() * t.element_size() for pair in caches for t in pair)
    assert _resident_bytes() - before >= 0.9 * cache_bytes  # every page is resident now
    for i, (k, v) in enumerate(caches):
        assert (k.view(-1)[::32768] == i + 1).all() and v.view(-1)[-1] == -(i + 1)
