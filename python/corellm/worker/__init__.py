"""The model runner: KV cache, persistent batch, forward and sampling for each step."""
