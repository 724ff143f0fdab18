"""Re-encodes a GGUF file's tensors as BF16 (matrices) and F32 (norms), keeping its metadata and
llama.cpp's tensor layout: the same model for llama.cpp and corellm in one precision, for
side-by-side benchmarks."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def float32_to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """Round to nearest even, as torch and llama.cpp do; returns uint16 bit patterns."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = bits + (0x7FFF + ((bits >> 16) & 1))
    out = (rounded >> 16).astype(np.uint16)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    out[nan] = ((bits[nan] >> 16) | 0x40).astype(np.uint16)
    return out


def export_bf16(source: str | Path, dest: str | Path) -> Path:
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
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(field.types) > 1 else None
        writer.add_key_value(key, value, vtype, sub_type=sub)
    for t in reader.tensors:
        data = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        if data.ndim >= 2:
            writer.add_tensor(t.name, float32_to_bf16_bits(data), raw_shape=data.shape,
                              raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            writer.add_tensor(t.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(dest)
