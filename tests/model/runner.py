"""A minimal single-batch runner for model tests: lays sequences into a paged KV cache (shuffled
blocks) and runs prefill and decode steps through corellm's model, without the engine — op by op,
or through the native decoder stack (native=True)."""

from __future__ import annotations

import math

import torch

from corellm import ops
from corellm.lora.lora_batch import LoraBatch
from corellm.model import AttentionMetadata, LlamaForCausalLM
from corellm.model.native_stack import NativeDecoderStack


class PagedRunner:
    def __init__(self, model: LlamaForCausalLM, max_tokens_per_seq: int, num_seqs: int, block_size: int = 16,
                 seed: int = 0, native: bool = False, lora_adapters: tuple = ()):
        """lora_adapters: LoRA adapters held in slots 0, 1, ... (step's lora names a sequence's slot)."""
        c = model.config
        self.model, self.block_size = model, block_size
        blocks_per_seq = math.ceil(max_tokens_per_seq / block_size)
        num_blocks = blocks_per_seq * num_seqs + 1
        k_shape, v_shape = ops.kv_cache_shapes(num_blocks, c.num_key_value_heads, c.head_dim, block_size, model.dtype)
        self.kv_caches = [(torch.zeros(k_shape, dtype=model.dtype), torch.zeros(v_shape, dtype=model.dtype))
                          for _ in range(c.num_hidden_layers)]
        perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))[:blocks_per_seq * num_seqs]
        self.block_table = perm.view(num_seqs, blocks_per_seq).to(torch.int32)
        self.lengths = [0] * num_seqs
        self.native_stack = NativeDecoderStack(model, self.kv_caches) if native else None
        self.lora_adapters = list(lora_adapters)
        for slot, adapter in enumerate(self.lora_adapters):
            if self.native_stack is not None:
                self.native_stack.set_lora(slot, adapter)

    def step(self, chunks: list[list[int]], hidden_states: list | None = None,
             inputs_embeds: torch.Tensor | None = None, lora: list[int] | None = None) -> torch.Tensor:
        """chunks[i]: the next tokens of sequence i (empty: not scheduled). Returns float32 logits
        of the last token of every scheduled sequence, and the full hidden states if asked.
        inputs_embeds: the step's input rows in place of the tokens' embeddings. lora[i]: sequence
        i's LoRA slot (-1: none)."""
        rows = [i for i, c in enumerate(chunks) if c]
        ids, pos, slots, qsl, seq_lens = [], [], [], [0], []
        for i in rows:
            start = self.lengths[i]
            for j, t in enumerate(chunks[i]):
                p = start + j
                ids.append(t)
                pos.append(p)
                slots.append(int(self.block_table[i, p // self.block_size]) * self.block_size + p % self.block_size)
            self.lengths[i] += len(chunks[i])
            qsl.append(len(ids))
            seq_lens.append(self.lengths[i])
        i32 = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
        attn = AttentionMetadata(i32(slots), self.block_table[rows].contiguous(), i32(seq_lens), i32(qsl))
        lora_slots = None if lora is None else i32([lora[i] for i in rows for _ in chunks[i]])
        with torch.inference_mode():
            if self.native_stack is not None and hidden_states is None:
                h = self.native_stack.forward(i32(ids), i32(pos), attn, inputs_embeds=inputs_embeds,
                                              lora_slots=lora_slots)
            else:
                batch = None if lora_slots is None else LoraBatch(lora_slots, self.lora_adapters)
                h = self.model.forward(i32(ids), i32(pos), attn, self.kv_caches, hidden_states,
                                       inputs_embeds=inputs_embeds, lora=batch)
            last = torch.tensor(qsl[1:]) - 1
            return self.model.compute_logits(h[last])


def greedy_decode(model: LlamaForCausalLM, prompts: list[list[int]], steps: int, native: bool,
                  together: bool = True) -> torch.Tensor:
    """Prefills the prompts, then decodes `steps` greedy tokens, all sequences in one step
    (together) or each in a step of its own. Returns the logits of each decode step [steps, seqs, vocab]."""
    runner = PagedRunner(model, 64, len(prompts), block_size=8, seed=1, native=native)
    last = runner.step(prompts)
    out = []
    for _ in range(steps):
        nxt = last.argmax(-1).tolist()
        if together:
            last = runner.step([[t] for t in nxt])
        else:
            last = torch.cat([runner.step([[t] if j == i else [] for j in range(len(prompts))])
                              for i, t in enumerate(nxt)])
        out.append(last)
    return torch.stack(out)


def assert_last_logits_match(model: LlamaForCausalLM, hf_model, ids: list[int], **tolerance) -> None:
    """The last position's logits of `ids` (one prefill through the paged cache) against an HF
    model's, within `tolerance` (torch.testing.assert_close's atol / rtol)."""
    got = PagedRunner(model, 64, 1).step([ids])
    with torch.no_grad():
        want = hf_model(torch.tensor([ids])).logits[0, -1:]
    torch.testing.assert_close(got, want, **tolerance)
