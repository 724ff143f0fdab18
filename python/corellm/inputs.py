"""The prompt forms `LLM.generate`, `LLM.embed` and the async engine take, as vLLM's `vllm.inputs`:
a string, a TextPrompt or a TokensPrompt. A dict prompt is checked here, key by key: a key no
form defines, or one corellm does not honour, is a ValueError naming it, never dropped."""

from __future__ import annotations

from typing import Any, TypedDict, Union

from typing_extensions import NotRequired


class TextPrompt(TypedDict):
    """A prompt as text, tokenized with the model's tokenizer (special tokens added as for a string)."""

    prompt: str
    multi_modal_data: NotRequired[dict[str, Any]]  # {"image": an image or a list}, a LLaVA-style model's
    cache_salt: NotRequired[str]  # prefix-cache hits only between prompts with the same salt


class TokensPrompt(TypedDict):
    """A prompt as token ids, used as they are (`prompt`: its text for the outputs, optional)."""

    prompt_token_ids: list[int]
    prompt: NotRequired[str]
    multi_modal_data: NotRequired[dict[str, Any]]
    cache_salt: NotRequired[str]
    token_type_ids: NotRequired[list[int]]  # an encoder's (BERT's) segment per token; left out: all 0


PromptType = Union[str, TextPrompt, TokensPrompt]

# The keys a dict prompt may hold. multi_modal_names is the server's: how errors call each image.
PROMPT_KEYS = ("prompt", "prompt_token_ids", "multi_modal_data", "cache_salt", "multi_modal_names", "token_type_ids")
# vLLM's keys whose meaning corellm lacks -> the value that means the same as leaving it out.
NOT_HONOURED_PROMPT_KEYS: dict[str, Any] = {"mm_processor_kwargs": {}, "multi_modal_uuids": None}


def check_prompt_keys(prompt: dict) -> None:
    """ValueError naming the first key of a dict prompt that no prompt form defines or that corellm
    does not honour (with a value other than the one that means leaving it out)."""
    for key, value in prompt.items():
        if key in PROMPT_KEYS:
            continue
        if key in NOT_HONOURED_PROMPT_KEYS:
            if value is None or value == NOT_HONOURED_PROMPT_KEYS[key]:
                continue
            raise ValueError(f"the prompt's {key!r} is not supported by corellm")
        raise ValueError(f"a prompt has no key {key!r}: a TextPrompt or TokensPrompt takes "
                         f"{', '.join(repr(k) for k in PROMPT_KEYS[:4])}")


def prompt_cache_salt(prompt: PromptType) -> str:
    """A dict prompt's cache_salt ("" when it has none); ValueError unless a non-empty string."""
    salt = prompt.get("cache_salt") if isinstance(prompt, dict) else None
    if salt is None:
        return ""
    if not isinstance(salt, str) or not salt:
        raise ValueError(f"the prompt's cache_salt must be a non-empty string, got {salt!r}")
    return salt
