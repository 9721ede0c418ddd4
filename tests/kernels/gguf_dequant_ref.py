"""Independent dequantization reference: ggml's own numpy implementation (PyPI `gguf`).

usage: gguf_dequant_ref.py TYPE IN OUT
  TYPE  ggml type name as in gguf.GGMLQuantizationType (Q4_0, Q4_K, F16, BF16, ...)
  IN    raw blocks exactly as stored in a GGUF tensor (whole blocks)
  OUT   little-endian float32 values, block_size * num_blocks of them
Exits non-zero with a message on any error (unknown type, partial block).
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGML_QUANT_SIZES
from gguf.quants import dequantize


def main() -> int:
    type_name, src, dst = sys.argv[1:4]
    qtype = GGMLQuantizationType[type_name.upper()]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    raw = np.fromfile(src, dtype=np.uint8)
    if raw.size % type_size:
        print(f"{src}: {raw.size} bytes is not a whole number of {type_name} blocks", file=sys.stderr)
        return 2
    values = dequantize(raw.reshape(1, -1), qtype).astype(np.float32).reshape(-1)
    if values.size != raw.size // type_size * block_size:
        print(f"unexpected element count {values.size}", file=sys.stderr)
        return 3
    values.tofile(dst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
