"""LoraRegistry: the LoRA adapters an engine knows by name — loaded once each (from --lora-modules,
POST /v1/load_lora_adapter, or the first request that names a LoRARequest) and found again by
name. A request holds its adapter itself, so removing one from the registry does not touch the
requests already running with it.

Names and ids, as vLLM's: an adapter's name and lora_int_id each belong to one adapter; a
LoRARequest that gives a known name with another id or directory is refused rather than
silently served with the other adapter."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from corellm.lora.lora_adapter import LoraAdapter, load_lora_adapter
from corellm.lora.lora_request import LoRARequest
from corellm.model.model_config import ModelConfig


@dataclass(frozen=True)
class RegisteredLora:
    request: LoRARequest
    adapter: LoraAdapter


class LoraRegistry:
    def __init__(self, config: ModelConfig, max_lora_rank: int, dtype: torch.dtype = torch.float32):
        """dtype: the model's, in which the adapters' matrices are kept."""
        self.config = config
        self.max_lora_rank = max_lora_rank
        self.dtype = dtype
        self._by_name: dict[str, RegisteredLora] = {}
        # The server's routes and its engine's requests may race: changes (each with its file
        # reads) one at a time under _loading; the table itself under _lock, held only briefly, so
        # that a lookup never waits for a load.
        self._loading = threading.Lock()
        self._lock = threading.Lock()

    def resolve(self, request: LoRARequest) -> LoraAdapter:
        """The adapter a request runs with, loaded on its first use (ValueError naming what is wrong
        with it: a bad directory, a name or id already given to another adapter)."""
        if not isinstance(request, LoRARequest):
            raise ValueError(f"lora_request must be a LoRARequest, got {type(request).__name__}")
        known = self._known(request)
        if known is not None:
            return known
        with self._loading:
            known = self._known(request)  # loaded by another thread meanwhile
            if known is not None:
                return known
            with self._lock:
                for other in self._by_name.values():
                    if other.request.lora_int_id == request.lora_int_id:
                        raise ValueError(f"lora_int_id {request.lora_int_id} belongs to LoRA adapter "
                                         f"{other.request.lora_name!r}; {request.lora_name!r} needs another")
            adapter = load_lora_adapter(request.lora_name, request.lora_path, self.config, self.max_lora_rank,
                                        self.dtype)
            with self._lock:
                self._by_name[request.lora_name] = RegisteredLora(request, adapter)
            return adapter

    def _known(self, request: LoRARequest) -> LoraAdapter | None:
        """The adapter loaded under the request's name, None if none is; ValueError if that one
        has another id or directory."""
        with self._lock:
            known = self._by_name.get(request.lora_name)
        if known is None:
            return None
        if (known.request.lora_int_id, known.request.lora_path) != (request.lora_int_id, request.lora_path):
            raise ValueError(f"LoRA adapter {request.lora_name!r} is loaded as id {known.request.lora_int_id} "
                             f"from {known.request.lora_path}; this request gives id {request.lora_int_id} "
                             f"and {request.lora_path}")
        return known.adapter

    def add(self, name: str, path: str, base_model_name: str | None = None, replace: bool = False) -> LoRARequest:
        """Loads an adapter under a name, its id the next free one; ValueError if the name is taken,
        unless `replace`: the name then passes to the new adapter once it has loaded."""
        with self._loading:
            with self._lock:
                if name in self._by_name and not replace:
                    raise ValueError(f"a LoRA adapter named {name!r} is already loaded")
                next_id = max((r.request.lora_int_id for r in self._by_name.values()), default=0) + 1
            request = LoRARequest(name, next_id, path, base_model_name)
            adapter = load_lora_adapter(name, path, self.config, self.max_lora_rank, self.dtype)
            with self._lock:
                self._by_name[name] = RegisteredLora(request, adapter)
            return request

    def get(self, name: str) -> LoRARequest | None:
        with self._lock:
            known = self._by_name.get(name)
            return None if known is None else known.request

    def remove(self, name: str) -> bool:
        """Forgets the adapter (requests running with it finish with it); False if unknown."""
        with self._lock:
            return self._by_name.pop(name, None) is not None

    def requests(self) -> list[LoRARequest]:
        """The adapters known, in the order they were loaded."""
        with self._lock:
            return [r.request for r in self._by_name.values()]
