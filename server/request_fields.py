"""Request fields corellm does not honour: never silently dropped. A field of the OpenAI or vLLM API
that corellm does not implement yet is refused with 400 naming it — unless its value is one that
means the same as leaving it out (`"functions": []`, `"best_of": 1`). A request argument corellm does
not know (a top-level field: a typo such as `"temprature"`, a client's own extension, or a newer
field of another server's API) is refused with 400 naming it too, as OpenAI's API does ("Unrecognized
request argument supplied"): a 200 would answer a request other than the one sent.
`--allow-unknown-fields` has the server ignore such arguments instead, as vLLM does. Within the
request's parts (a message, a tool, stream_options) a field corellm does not know is ignored, as
OpenAI's API ignores them: clients keep their own keys on the messages they send back (an `id`, UI
options). Each ignored name is logged once, for the first 64 names.

The request models accept extra fields (pydantic keeps them in model_extra) so that they can be
told apart here, after validation."""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel

from corellm.server.errors import bad_request

logger = logging.getLogger("corellm.server")

# Field -> the values that mean the same as leaving it out (None always does).
NOT_HONOURED: dict[str, tuple[Any, ...]] = {
    # OpenAI: the old function calling, other modalities, server-side state.
    "functions": ([],), "function_call": ("none",),
    "tools": ([],), "tool_choice": ("none",),  # on /v1/completions (chat declares and honours them)
    "prediction": (),  # on /v1/completions and /v1/responses (chat's, with n-gram speculative decoding)
    "audio": (), "modalities": (["text"],),
    "web_search_options": (), "verbosity": (), "store": (False,),
    "service_tier": ("auto", "default", "standard_only"), "best_of": (1,),
    # In messages of the history.
    "refusal": (), "annotations": ([],),
    # vLLM: structured output's other knobs, logits processors and output forms corellm lacks.
    "guided_decoding_backend": ("auto", "llguidance", "guidance"), "logits_processors": ([],),
    "mm_processor_kwargs": ({},), "media_io_kwargs": ({},), "prompt_embeds": (), "kv_transfer_params": (),
    "ec_transfer_params": (), "vllm_xargs": (),
    "return_token_offsets": (False,),  # vLLM's render routes' (corellm's give no offsets); ignored elsewhere there
    # vLLM's /inference/v1/generate: images given as rendered features or raw parts, and what its own
    # front end passes on about the prompt
    "features": (), "content_parts": (), "token_offsets": (), "reasoning_ended": (),
    "reasoning_parser_kwargs": (),
    "reasoning_effort_budget": (),
    # Anthropic's Messages API: code execution's container, MCP servers, context management, fast
    # mode, data residency, prompt-cache diagnostics
    "container": (), "mcp_servers": ([],), "context_management": (), "speed": ("standard",), "inference_geo": (),
    "diagnostics": (),
    # vLLM's Responses API: its chat-format messages in the reply, and stateless multi-turn in Harmony's format
    "enable_response_messages": (False,), "previous_input_messages": (), "previous_response": (),
}

# Fields of the APIs that change nothing corellm computes, accepted as they are.
INFORMATIONAL = {"user", "metadata", "prompt_cache_key", "prompt_cache_retention", "safety_identifier",
                 "parallel_tool_calls", "include_obfuscation", "session_id", "user_profile_id", "workspace_id"}

# Names already logged: each once, and at most this many (a client sending random names must fill
# neither the log nor this set).
_MAX_LOGGED_UNKNOWN = 64
_logged_unknown: set[str] = set()


def check_request_fields(model: BaseModel, allow_unknown: bool = False, path: str = "") -> None:
    """Raises a 400 (APIError) for the first field given that corellm does not honour (at any
    depth, named by its path: `messages[1].audio`), or that it does not know unless allow_unknown;
    the unknown fields let through are logged once per name. Walks nested models (messages,
    stream_options), whose unknown fields are always let through."""
    for name, value in (model.model_extra or {}).items():
        where = f"{path}{name}"
        if name in NOT_HONOURED:
            if value is not None and not any(value == v for v in NOT_HONOURED[name]):
                raise bad_request(f"{where} is not supported by corellm", where, "unsupported_field")
        elif name in INFORMATIONAL:
            continue
        elif not allow_unknown:
            raise bad_request(f"unrecognized request argument {where!r}: corellm does not know it (a typo, or an "
                              f"argument of another API; start the server with --allow-unknown-fields to have such "
                              f"arguments ignored)", where, "unknown_field")
        elif name not in _logged_unknown and len(_logged_unknown) < _MAX_LOGGED_UNKNOWN:
            _logged_unknown.add(name)
            logger.warning("ignoring the request field %r: corellm does not know it%s", name,
                           "" if len(_logged_unknown) < _MAX_LOGGED_UNKNOWN else " (further unknown names are not logged)")
    for name in type(model).model_fields:
        _check_nested(getattr(model, name), f"{path}{name}")


def _check_nested(value: Any, path: str) -> None:
    if isinstance(value, BaseModel):
        check_request_fields(value, allow_unknown=True, path=f"{path}.")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, BaseModel):
                check_request_fields(item, allow_unknown=True, path=f"{path}[{i}].")
