"""LoRA adapters (vLLM's enable_lora): PEFT adapter directories loaded for the base model, each
request run with the adapter it names — any mix of adapters and the base model in one step."""

from corellm.lora.lora_adapter import LoraAdapter, load_lora_adapter
from corellm.lora.lora_request import LoRARequest

__all__ = ["LoRARequest", "LoraAdapter", "load_lora_adapter"]
