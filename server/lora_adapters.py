"""The server's LoRA adapters, as vLLM serves them: --lora-modules names them at start-up, a
request's `model` picks one (Serving.resolve_model), GET /v1/models lists them after the base
model, and — where runtime updating is allowed (CORELLM_ALLOW_RUNTIME_LORA_UPDATING=true, or
vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING) — POST /v1/load_lora_adapter and
/v1/unload_lora_adapter change them while the server runs. Requests already running with an
adapter that is unloaded finish with it."""

from __future__ import annotations

import asyncio
import json
import os

from aiohttp import web
from pydantic import Field

from corellm.lora.lora_registry import LoraRegistry
from corellm.server.errors import APIError, bad_request
from corellm.server.request_part import RequestPart
from corellm.server.serving import Serving, now

RUNTIME_UPDATING_VARIABLES = ("CORELLM_ALLOW_RUNTIME_LORA_UPDATING", "VLLM_ALLOW_RUNTIME_LORA_UPDATING")


def runtime_updating_allowed() -> bool:
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes") for v in RUNTIME_UPDATING_VARIABLES)


def lora_modules_of(values: list[str]) -> list[tuple[str, str, str | None]]:
    """--lora-modules: each NAME=PATH or a JSON object {"name", "path", "base_model_name"} (vLLM's
    two forms) -> (name, path, base_model_name); ValueError naming the one that is neither."""
    modules = []
    for value in values:
        if value.lstrip().startswith("{"):
            try:
                spec = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"--lora-modules: {value!r} is not valid JSON: {e}") from None
            unknown = set(spec) - {"name", "path", "base_model_name"} if isinstance(spec, dict) else set()
            if not isinstance(spec, dict) or unknown or not all(isinstance(spec.get(k), str) and spec[k]
                                                                 for k in ("name", "path")):
                raise ValueError(f"--lora-modules: {value!r} must be a JSON object with a name and a path (and "
                                 f"optionally base_model_name){f'; unknown keys {sorted(unknown)}' if unknown else ''}")
            modules.append((spec["name"], spec["path"], spec.get("base_model_name")))
        else:
            name, sep, path = value.partition("=")
            if not sep or not name or not path:
                raise ValueError(f"--lora-modules: {value!r} is not NAME=PATH (or a JSON object)")
            modules.append((name, path, None))
    names = [name for name, _, _ in modules]
    if len(set(names)) != len(names):
        raise ValueError(f"--lora-modules names an adapter twice: {sorted(n for n in set(names) if names.count(n) > 1)}")
    return modules


def registry_of(serving: Serving) -> LoraRegistry:
    loras = serving.loras
    if loras is None:
        raise bad_request("this server runs without LoRA adapters (start it with --enable-lora)", "lora_name")
    return loras


def lora_model_cards(serving: Serving) -> list[dict]:
    """GET /v1/models' entries for the adapters, as vLLM lists them (root: the directory; parent:
    the base model's name)."""
    if serving.loras is None:
        return []
    return [{"id": r.lora_name, "object": "model", "created": now(), "owned_by": "corellm", "root": r.lora_path,
             "parent": r.base_model_name or serving.config.served_model_name,
             "max_model_len": serving.engine.max_model_len} for r in serving.loras.requests()]


class LoadLoRAAdapterRequest(RequestPart):
    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)
    load_inplace: bool = False  # vLLM's: an adapter of the same name is replaced rather than refused


class UnloadLoRAAdapterRequest(RequestPart):
    lora_name: str = Field(min_length=1)
    lora_int_id: int | None = None  # vLLM's; when given it must be the adapter's


async def load_adapter(serving: Serving, req: LoadLoRAAdapterRequest) -> web.Response:
    """Loads the adapter (on a worker thread: the event loop serves on) under its name."""
    loras = registry_of(serving)
    if req.lora_name == serving.config.served_model_name:
        raise bad_request(f"{req.lora_name!r} is the base model's name", "lora_name")
    known = loras.get(req.lora_name)
    if known is not None and not req.load_inplace:
        raise bad_request(f"The lora adapter '{req.lora_name}' has already been loaded (load_inplace replaces it)",
                          "lora_name")
    try:
        await asyncio.to_thread(loras.add, req.lora_name, req.lora_path, replace=req.load_inplace)
    except ValueError as e:
        raise bad_request(str(e), "lora_path") from None
    return web.Response(text=f"Success: LoRA adapter '{req.lora_name}' added successfully.")


async def unload_adapter(serving: Serving, req: UnloadLoRAAdapterRequest) -> web.Response:
    loras = registry_of(serving)
    known = loras.get(req.lora_name)
    if known is None or (req.lora_int_id is not None and req.lora_int_id != known.lora_int_id):
        raise APIError(404, f"The lora adapter '{req.lora_name}' cannot be found.", "not_found_error", "lora_name")
    loras.remove(req.lora_name)
    return web.Response(text=f"Success: LoRA adapter '{req.lora_name}' removed successfully.")


def add_lora_modules_arg(p) -> None:
    p.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME=PATH",
                   help='LoRA adapters (PEFT directories) served by name beside the base model: NAME=PATH or '
                        '\'{"name": ..., "path": ..., "base_model_name": ...}\' (needs --enable-lora)')


def checked_lora_modules(args) -> list[tuple[str, str, str | None]]:
    """--lora-modules read before the model loads (ValueError naming a bad one, or the missing --enable-lora)."""
    modules = lora_modules_of(args.lora_modules)
    if modules and not args.enable_lora:
        raise ValueError("--lora-modules needs --enable-lora")
    return modules


def load_lora_modules(engine, modules: list[tuple[str, str, str | None]], served_model_name: str) -> None:
    """Loads --lora-modules' adapters into the engine (ValueError naming the one that does not load)."""
    for name, path, base_model_name in modules:
        if name == served_model_name:
            raise ValueError(f"--lora-modules: {name!r} is the base model's name")
        try:
            engine.parts.input_processor.loras.add(name, path, base_model_name)
        except ValueError as e:
            raise ValueError(f"--lora-modules: {e}") from None
