"""Re-encodes a GGUF file's tensors as BF16 (matrices) and F32 (norms), keeping its metadata and
llama.cpp's tensor layout: the same model for llama.cpp and corellm in one precision, for
side-by-side benchmarks."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np


def float32_to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """Round to nearest even, as torch and llama.cpp do; returns uint16 bit patterns."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = bits + (0x7FFF + ((bits >> 16) & 1))
    out = (rounded >> 16).astype(np.uint16)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    out[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return out


# A tensor to write: (name, float32 values, whether in BF16 — else F32).
Tensor = tuple[str, np.ndarray, bool]


def export_bf16(source: str | Path, dest: str | Path, *,
                field_value: Callable[[str, Any], Any] | None = None,
                extra_fields: Callable[[Any], None] | None = None,
                tensors: Callable[[str, np.ndarray], Iterable[Tensor]] | None = None) -> Path:
    """source re-encoded into dest: matrices BF16, the rest F32, the metadata kept. For a derived
    model (bench/moe.py's): field_value(key, value) -> the value to write; extra_fields(writer)
    adds keys; tensors(name, values) -> the tensors to write in its place."""
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(str(source))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(dest), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        if key == "general.file_type":
            value = int(gguf.LlamaFileType.MOSTLY_BF16)
        if field_value is not None:
            value = field_value(key, value)
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(field.types) > 1 else None
        writer.add_key_value(key, value, vtype, sub_type=sub)
    if extra_fields is not None:
        extra_fields(writer)
    for t in reader.tensors:
        data = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        for name, values, bf16 in (tensors or _as_is)(t.name, data):
            if bf16:
                writer.add_tensor(name, float32_to_bf16_bits(values), raw_shape=values.shape,
                                  raw_dtype=gguf.GGMLQuantizationType.BF16)
            else:
                writer.add_tensor(name, np.ascontiguousarray(values, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(dest)


def _as_is(name: str, values: np.ndarray) -> list[Tensor]:
    return [(name, values, values.ndim >= 2)]
