"""Independent quantization reference: ggml's own numpy quantizers (PyPI `gguf`).

usage: gguf_quantize_ref.py TYPE IN OUT
  TYPE  ggml type name as in gguf.GGMLQuantizationType (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, F16, BF16)
  IN    little-endian float32 values, a whole number of blocks of TYPE
  OUT   the quantized blocks, byte for byte as a GGUF tensor stores them
Exits non-zero with a message on any error (unknown type, no quantizer, partial block).
"""
import sys

import numpy as np
from gguf import GGMLQuantizationType, GGML_QUANT_SIZES
from gguf.quants import quantize


def main() -> int:
    type_name, src, dst = sys.argv[1:4]
    qtype = GGMLQuantizationType[type_name.upper()]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    values = np.fromfile(src, dtype=np.float32)
    if values.size % block_size:
        print(f"{src}: {values.size} values is not a whole number of {type_name} blocks",
              file=sys.stderr)
        return 2
    try:
        # F16 is numpy's cast: overflow to inf is the intended result, not an error.
        with np.errstate(over="ignore", invalid="ignore"):
            blocks = quantize(values.reshape(1, -1), qtype)
    except NotImplementedError as e:
        print(f"no python quantizer for {type_name}: {e}", file=sys.stderr)
        return 3
    raw = np.ascontiguousarray(blocks).view(np.uint8).reshape(-1)
    if raw.size != values.size // block_size * type_size:
        print(f"unexpected byte count {raw.size}", file=sys.stderr)
        return 4
    raw.tofile(dst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
