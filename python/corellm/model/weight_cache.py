"""A cache of what loading a GGUF file produces — its config, tokenizer and weights (dequantized
to the target dtype, or quantized tensors packed for quant_gemm) — as safetensors + JSON, so that
later starts skip parsing, dequantizing and packing (seconds for the default model) and map the
weights from disk instead.

The key covers the file's path, size and modification time, the dtype, whether weights stay
quantized, and the cache format: a changed file is read afresh. The cache lives in
$CORELLM_CACHE_DIR (default ~/.cache/corellm); a cache that cannot be written is skipped with a
log line, never an error. Writing an entry removes the entries of files that are gone or have
changed since (every copy of a file at a new path, every edit of it, made an entry of its own, and
nothing removed the old ones: test runs from fresh clones had left 15 GB)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

import tokenizers
import torch

from corellm.model.encoder_config import EncoderConfig
from corellm.model.model_config import ModelConfig
from corellm.model.quantized_tensor import QuantizedTensor
from corellm.tokenizer import Tokenizer

logger = logging.getLogger("corellm")
_FORMAT = "corellm-gguf-cache-3"  # 3: Q2_K and IQ4 kept quantized, Q3_K no longer widened into Q6_K


def cache_root() -> Path:
    return Path(os.environ.get("CORELLM_CACHE_DIR") or Path.home() / ".cache" / "corellm")


class GGUFWeightCache:
    def __init__(self, gguf_path: Path, dtype: torch.dtype, quantized: bool = False):
        st = gguf_path.stat()
        # what the entry was made from, kept in its meta.json: an entry whose file no longer matches is stale
        self.source = {"path": str(gguf_path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}
        key = f"{_FORMAT}|{self.source['path']}|{st.st_size}|{st.st_mtime_ns}|{dtype}|{'gguf' if quantized else 'dense'}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:20]
        kind = "gguf" if quantized else str(dtype).replace("torch.", "")
        self.dir = cache_root() / f"{gguf_path.stem}-{kind}-{digest}"

    def load(self) -> tuple[ModelConfig | EncoderConfig, Tokenizer, torch.Tensor | None,
                            dict[str, torch.Tensor | QuantizedTensor]] | None:
        meta_path = self.dir / "meta.json"
        if not meta_path.exists():
            return None
        try:
            from safetensors.torch import load_file

            meta = json.loads(meta_path.read_text())
            config_type = EncoderConfig if meta.get("config_type") == "encoder" else ModelConfig
            config = config_type(**meta["config"])
            t = meta["tokenizer"]
            backend = tokenizers.Tokenizer.from_file(str(self.dir / "tokenizer.json"))
            tokenizer = Tokenizer(backend, bos_token_id=t["bos_token_id"], eos_token_ids=t["eos_token_ids"],
                                  pad_token_id=t["pad_token_id"], chat_template=t["chat_template"], source=t["source"])
            weights: dict[str, torch.Tensor | QuantizedTensor] = load_file(str(self.dir / "weights.safetensors"))
            rope_factors = weights.pop("__rope_factors__", None)
            for name, (ggml_type, n, k) in meta.get("quantized", {}).items():
                weights[name] = QuantizedTensor(ggml_type, (n, k), weights[name])
            return config, tokenizer, rope_factors, weights
        except Exception as e:  # noqa: BLE001 - a damaged cache is read afresh, not fatal
            logger.warning("ignoring the weight cache %s: %s", self.dir, e)
            return None

    def store(self, config: ModelConfig | EncoderConfig, tokenizer: Tokenizer, rope_factors: torch.Tensor | None,
              weights: dict[str, torch.Tensor | QuantizedTensor]) -> None:
        try:
            from safetensors.torch import save_file

            self.dir.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=self.dir.parent, prefix=".tmp-"))
            tensors = {k: v.packed if isinstance(v, QuantizedTensor) else v for k, v in weights.items()}
            quantized = {k: [v.ggml_type, *v.shape] for k, v in weights.items() if isinstance(v, QuantizedTensor)}
            if rope_factors is not None:
                tensors["__rope_factors__"] = rope_factors
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "weights.safetensors"))
            tokenizer.backend.save(str(tmp / "tokenizer.json"))
            meta = {"config": dataclasses.asdict(config),
                    "config_type": "encoder" if config.encoder_only else "decoder",
                    "tokenizer": {"bos_token_id": tokenizer.bos_token_id, "eos_token_ids": tokenizer.eos_token_ids,
                                  "pad_token_id": tokenizer.pad_token_id, "chat_template": tokenizer.chat_template,
                                  "source": tokenizer.source},
                    "quantized": quantized, "source": self.source}
            (tmp / "meta.json").write_text(json.dumps(meta))
            if self.dir.exists():
                shutil.rmtree(tmp)
                return
            tmp.rename(self.dir)  # atomic: readers see all files or none
        except OSError as e:
            logger.warning("could not write the weight cache %s: %s", self.dir, e)
            return
        self.remove_stale_entries()

    def remove_stale_entries(self) -> None:
        """Removes every entry whose GGUF file is gone, or has another size or modification time
        than when the entry was made (an entry from before the source was recorded: gone only,
        from its tokenizer's source where that is an absolute path). Entries being written (.tmp-*)
        and unreadable ones are left alone; a process still mapping a removed entry's weights keeps
        them until it exits."""
        for entry in cache_root().iterdir():
            if entry == self.dir or entry.name.startswith("."):
                continue
            try:
                meta = json.loads((entry / "meta.json").read_text())
                source = meta.get("source") or {"path": meta["tokenizer"]["source"]}
                if os.path.isabs(source["path"]) and not _still_matches(source):
                    shutil.rmtree(entry)
                    logger.info("removed the stale weight cache entry %s (%s changed or gone)", entry, source["path"])
            except (OSError, ValueError, KeyError, TypeError) as e:
                logger.debug("weight cache entry %s left alone: %s", entry, e)


def _still_matches(source: dict) -> bool:
    """Whether the file an entry was made from is still there as it was (size and modification
    time, where the entry recorded them)."""
    try:
        st = os.stat(source["path"])
    except FileNotFoundError:
        return False
    return all(source.get(field) in (None, value) for field, value in
               (("size", st.st_size), ("mtime_ns", st.st_mtime_ns)))
