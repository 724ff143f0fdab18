"""LoRARequest: which LoRA adapter a request runs with, as vLLM's (vllm.lora.request.LoRARequest):
a name, an integer id and the adapter's directory (PEFT's adapter_config.json and
adapter_model.safetensors)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    lora_name: str
    lora_int_id: int  # >= 1, as vLLM's (0 means no adapter there)
    lora_path: str
    base_model_name: str | None = None  # the model the adapter was trained on (listed by /v1/models)

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"LoRARequest: lora_name must be a non-empty string, got {self.lora_name!r}")
        if isinstance(self.lora_int_id, bool) or not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"LoRARequest: lora_int_id must be an integer >= 1, got {self.lora_int_id!r}")
        if not isinstance(self.lora_path, str) or not self.lora_path:
            raise ValueError(f"LoRARequest: lora_path must be a non-empty string, got {self.lora_path!r}")
