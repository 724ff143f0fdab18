"""Where a step's logits are written on the CPU: one float32 tensor that every step reuses.

A step's logits are [rows, vocab] float32: 50 MB for 256 decoding requests over SmolLM2's 49,152
tokens. A fresh tensor that size is fresh memory from the kernel each step (glibc maps every
allocation above 32 MiB anew and unmaps it on free), and each of its 4 KiB pages faults on its
first write: the LM head at 256 rows took 20 ms into a fresh tensor and 7 ms into a reused one
(Intel Xeon VM, 2 threads), and 256 requests decoding 64 tokens each took 7.4-7.5 s instead of
6.5 s. The runner asks for a view of the rows a step needs; the tensor grows to the largest
step seen (a power of two of rows, at most max_rows) and stays.

Not on a GPU: torch's caching allocator already reuses device memory there, and a buffer kept
beside it would only be memory the KV cache's sizing did not count."""

from __future__ import annotations

import torch


class LogitsBuffer:
    def __init__(self, vocab_size: int, max_rows: int, device: torch.device):
        """max_rows: the most logits rows a step can have (a request's sampled row, plus one per
        draft token it verifies); a step with more gets a tensor of its own."""
        if vocab_size <= 0 or max_rows <= 0:
            raise ValueError(f"LogitsBuffer: vocab_size and max_rows must be positive, got {vocab_size}, {max_rows}")
        self.vocab_size, self.max_rows, self.device = vocab_size, max_rows, device
        self._tensor: torch.Tensor | None = None

    def rows(self, n: int) -> torch.Tensor | None:
        """A float32 [n, vocab_size] view to write a step's logits into — valid until the next
        call, so the caller must be done with the previous step's — or None where the buffer does
        not serve (a GPU, or n > max_rows): the caller allocates."""
        if self.device.type != "cpu" or n > self.max_rows:
            return None
        if self._tensor is None or self._tensor.shape[0] < n:
            capacity = min(self.max_rows, 1 << max(n - 1, 0).bit_length())
            self._tensor = None  # the old one freed before the new one is mapped
            self._tensor = torch.empty((capacity, self.vocab_size), dtype=torch.float32)
        return self._tensor[:n]

    @property
    def nbytes(self) -> int:
        return 0 if self._tensor is None else self._tensor.numel() * self._tensor.element_size()
