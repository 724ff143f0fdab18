"""A GGUF file's metadata and tensor table, read in one pass: numeric arrays as numpy views,
string arrays in a tight loop, tensor data as views of one memory map. The `gguf` package's
reader builds an object per array element, which takes ~40 s for a 262k-token vocabulary (Gemma
3); this takes well under a second. Values and tensor views are the ones the `gguf` package gives
(tests/model/test_gguf_reader.py holds the two equal).

Layout (GGUF v2/v3, little-endian): magic "GGUF", version u32, tensor count u64, key-value count
u64; each key-value: key (u64 length + UTF-8), value type u32, value (an array: item type u32,
count u64, items); each tensor: name, n_dims u32, dims u64 x n_dims (fastest first), type u32,
offset u64; then, aligned to general.alignment (32), the data."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from gguf.constants import GGMLQuantizationType

# value type -> its struct format (scalars) and numpy dtype (arrays)
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q", 11: "<q", 12: "<d"}
_DTYPES = {k: np.dtype(v) for k, v in _SCALARS.items()}
_STRING, _ARRAY, _BOOL = 8, 9, 7


@dataclass
class GGUFTensor:
    name: str
    tensor_type: GGMLQuantizationType
    shape: list[int]  # dims, fastest-varying first (GGUF's order)
    data: np.ndarray  # F32 / F16: the values [.., dims[0]]; other types: the rows' bytes [rows, row bytes]


class GGUFContents:
    def __init__(self, path: str | Path):
        # The `gguf` package (its import reads every module of it, ~30 ms) only when a file is read:
        # a start from the weight cache reads none.
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        self._quant_sizes = GGML_QUANT_SIZES
        self.path = Path(path)
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        buf = self._map
        if bytes(buf[:4]) != b"GGUF":
            raise ValueError("not a GGUF file (bad magic)")
        self._buf, self._pos = buf, 4
        version = self._read("<I")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not supported (2, 3)")
        tensor_count, kv_count = self._read("<Q"), self._read("<Q")
        self.fields: dict[str, Any] = {}
        for _ in range(kv_count):
            key = self._string()
            self.fields[key] = self._value(self._read("<I"))
        infos = []
        for _ in range(tensor_count):
            name = self._string()
            dims = [int(self._read("<Q")) for _ in range(self._read("<I"))]
            infos.append((name, GGMLQuantizationType(self._read("<I")), dims, int(self._read("<Q"))))
        alignment = int(self.fields.get("general.alignment", 32))
        start = (self._pos + alignment - 1) // alignment * alignment
        self.tensors = [self._tensor(name, kind, dims, start + offset) for name, kind, dims, offset in infos]

    # ------------------------------------------------------------------ parsing
    def _read(self, fmt: str):
        size = struct.calcsize(fmt)
        value = struct.unpack_from(fmt, self._buf, self._pos)[0]
        self._pos += size
        return value

    def _string(self) -> str:
        n = self._read("<Q")
        s = bytes(self._buf[self._pos : self._pos + n]).decode("utf-8", errors="replace")
        self._pos += n
        return s

    def _value(self, kind: int) -> Any:
        if kind == _STRING:
            return self._string()
        if kind == _ARRAY:
            item, count = self._read("<I"), self._read("<Q")
            if item == _STRING:
                return self._strings(count)
            if item == _ARRAY:
                return [self._value(_ARRAY) for _ in range(count)]
            dtype = _DTYPES[item]
            values = np.frombuffer(self._buf, dtype=dtype, count=count, offset=self._pos)
            self._pos += count * dtype.itemsize
            return [bool(v) for v in values] if item == _BOOL else values.tolist()
        if kind not in _SCALARS:
            raise ValueError(f"unknown GGUF value type {kind}")
        value = self._read(_SCALARS[kind])
        return bool(value) if kind == _BOOL else value

    def _strings(self, count: int) -> list[str]:
        raw, pos, out = memoryview(self._map), self._pos, []  # a view: the file's bytes are not copied
        for _ in range(count):
            n = int.from_bytes(raw[pos : pos + 8], "little")
            out.append(str(raw[pos + 8 : pos + 8 + n], "utf-8", errors="replace"))
            pos += 8 + n
        self._pos = pos
        return out

    def _tensor(self, name: str, kind: GGMLQuantizationType, dims: list[int], at: int) -> GGUFTensor:
        block, type_size = self._quant_sizes[kind]
        elements = int(np.prod(dims)) if dims else 1
        nbytes = elements // block * type_size
        raw = self._map[at : at + nbytes]
        if len(raw) != nbytes:
            raise ValueError(f"tensor {name!r} runs past the end of the file")
        rows = list(reversed(dims[1:]))
        if kind.name == "F32":
            data = raw.view(np.float32).reshape(*rows, dims[0])
        elif kind.name == "F16":
            data = raw.view(np.float16).reshape(*rows, dims[0])
        else:
            data = raw.reshape(*rows, dims[0] // block * type_size)
        return GGUFTensor(name, kind, dims, data)
