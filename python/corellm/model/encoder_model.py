"""EncoderModel: what every encoder-only model (model/bert.py's BertEncoder: BERT, RoBERTa,
XLM-RoBERTa, Nomic BERT; model/modern_bert.py's ModernBertEncoder) does alike — its weights copied
from a checkpoint's names to their places (each model's _destinations), their bytes counted for the
start-up log, and the zero logits of the token that ends a pooling request.

A model subclasses it with its layers (each with linears()), _destinations, _plain_tensors,
forward(input_ids, positions, attn, token_type_ids) and classify(row); _encoder_name and _unread
say which checkpoint names it strips of a task model's prefix and which tensors it does not read."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from corellm.model.encoder_config import EncoderConfig
from corellm.model.layers import Linear


class EncoderModel:
    layers: list

    def __init__(self, config: EncoderConfig, dtype: torch.dtype, device: str | torch.device):
        self.config = config
        self.dtype = dtype
        self.device = torch.device(device)

    def _destinations(self) -> dict[str, tuple[torch.Tensor | Linear, int, int]]:
        """The model's tensor names (without a task model's prefix) -> (where, row offset, rows)."""
        raise NotImplementedError

    def _plain_tensors(self) -> list[torch.Tensor | None]:
        """The weights outside the projections: embeddings, norms, the classification head."""
        raise NotImplementedError

    @staticmethod
    def _encoder_name(name: str) -> str:
        """A checkpoint's tensor name as _destinations names it."""
        return name

    def _unread(self, name: str) -> bool:
        """Whether a tensor the model has no place for is one it does not read (and not a mistake)."""
        return False

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], source: str) -> None:
        """Copies every tensor to its place; ValueError naming the file and the tensor for a name the
        model has no place for, a shape the config does not give, or a tensor that is missing. An
        embedding model's pooler, masked-LM heads and the position-id buffer are not read."""
        dest = self._destinations()
        loaded: set[str] = set()
        for raw_name, tensor in weights:
            name = self._encoder_name(raw_name)
            if name not in dest and self._unread(name):
                continue
            if name not in dest:
                raise ValueError(f"{source}: unexpected tensor {raw_name!r} for {self.config.architecture}")
            target, offset, rows = dest[name]
            expected = (rows, *tuple(target.shape)[1:])
            if tuple(tensor.shape) != expected:
                raise ValueError(f"{source}: tensor {raw_name!r} has shape {tuple(tensor.shape)}, but the config "
                                 f"implies {expected}")
            if isinstance(target, Linear):
                target.load(offset, tensor)
            else:
                target[offset:offset + rows].copy_(tensor)
            loaded.add(name)
        missing = sorted(set(dest) - loaded)
        if missing:
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            raise ValueError(f"{source}: missing tensors {missing[:3]}{more}")
        for linear in self.all_linears():
            linear.finalize()

    def all_linears(self) -> list[Linear]:
        return [linear for layer in self.layers for linear in layer.linears()]

    def weight_bytes(self) -> dict[str, int]:
        """Bytes of the weights by storage type (a GGUF quantized type's name, or the dtype), for
        engine_parts' start-up log."""
        dense = str(self.dtype).replace("torch.", "")
        tensors = [(dense, t) for t in self._plain_tensors()]
        for linear in self.all_linears():
            tensors += [(q.type_name, q.packed) for _, q in linear.quantized]
            tensors += [(dense, linear.weight if linear.packed is None else linear.packed), (dense, linear.bias)]
        totals: dict[str, int] = {}
        for kind, t in tensors:
            if t is not None:
                totals[kind] = totals.get(kind, 0) + t.numel() * t.element_size()
        return totals

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """An encoder has no language-model head, and serves pooling requests only (the input
        processor refuses generation): the one token the engine samples to end such a request, which
        nobody reads, is drawn from zero logits, float32 [n, vocab] (into `out` when given)."""
        if out is None:
            return torch.zeros((hidden.shape[0], self.config.vocab_size), dtype=torch.float32, device=hidden.device)
        return out.zero_()
