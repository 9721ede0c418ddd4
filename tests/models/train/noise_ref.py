"""Independent reference for models/train/noise.h: numpy's Philox4x64-10 and the header's
Box-Muller recipe re-derived in plain Python floats (IEEE binary64, no fused multiply-add).

usage: noise_ref.py REQUESTS
  REQUESTS  a text file, one request a line, numbers in hex (no 0x):
    philox C0 C1 C2 C3 K0 K1             -> the four output words of Philox4x64_10
    pair W0 W1                           -> NormalPair(W0, W1), two float32 bit patterns
    normal SEED GEN MEMBER PARAM OFFSET N -> N float32 bit patterns: elements [OFFSET, OFFSET+N)
Prints one line per request: space-separated hex (16 digits per word, 8 per float).
"""
import decimal
import math
import struct
import sys

import numpy as np

MASK64 = (1 << 64) - 1

# The constants, each the nearest binary64 to its exact value, derived here rather than copied.
SQRT2 = math.sqrt(2.0)  # sqrt is correctly rounded
LN2 = float(decimal.Context(prec=50).ln(decimal.Decimal(2)))  # Decimal -> float rounds correctly
TWO_PI_OVER_2P53 = math.ldexp(2.0 * math.pi, -53)
LOG_COEF = [1 / (2 * k + 1) for k in range(11)]  # int / int is correctly rounded in Python
SIN_COEF = [(-1) ** k / math.factorial(2 * k + 1) for k in range(9)]
COS_COEF = [(-1) ** k / math.factorial(2 * k) for k in range(10)]


def philox_blocks(counter, key, count):
    """`count` Philox4x64_10 blocks for counters counter, counter + 1, ... (256-bit, little-endian
    words). numpy's random_raw increments its counter before each block, so start one below."""
    c = sum(w << (64 * i) for i, w in enumerate(counter))
    k = key[0] | (key[1] << 64)
    gen = np.random.Philox(counter=(c - 1) % (1 << 256), key=k)
    raw = gen.random_raw(4 * count)
    return [[int(w) for w in raw[4 * b:4 * b + 4]] for b in range(count)]


def horner(coef, z):
    p = coef[-1]
    for c in reversed(coef[:-1]):
        p = p * z + c
    return p


def f32_bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def normal_pair(w0, w1):
    v = (w0 >> 11) + 1
    e = v.bit_length() - 1
    m = math.ldexp(float(v), -e)
    if m > SQRT2:
        m = m * 0.5
        e = e + 1
    s = (m - 1.0) / (m + 1.0)
    log_u = float(e - 53) * LN2 + (2.0 * s) * horner(LOG_COEF, s * s)
    r = math.sqrt(-2.0 * log_u)

    a = w1 >> 11
    octant = a >> 50
    t = a & ((1 << 50) - 1)
    odd = octant & 1
    phi = float((1 << 50) - t if odd else t) * TWO_PI_OVER_2P53
    z = phi * phi
    sin_phi = phi * horner(SIN_COEF, z)
    cos_phi = horner(COS_COEF, z)
    co, si = (sin_phi, cos_phi) if odd else (cos_phi, sin_phi)
    c, s = [(co, si), (-si, co), (-co, -si), (si, -co)][octant >> 1]
    return f32_bits(r * c), f32_bits(r * s)


def normals(seed, gen, member, param, offset, n):
    if n == 0:
        return []
    first, last = offset // 4, (offset + n - 1) // 4
    values = []
    for x in philox_blocks([first, member, gen, 0], [seed, param], last - first + 1):
        values += normal_pair(x[0], x[1]) + normal_pair(x[2], x[3])
    start = offset - 4 * first
    return values[start:start + n]


def main() -> int:
    with open(sys.argv[1]) as f:
        for line in f:
            kind, *args = line.split()
            args = [int(a, 16) for a in args]
            if kind == "philox":
                print(" ".join(f"{w:016x}" for w in philox_blocks(args[:4], args[4:], 1)[0]))
            elif kind == "pair":
                print(" ".join(f"{b:08x}" for b in normal_pair(*args)))
            elif kind == "normal":
                print(" ".join(f"{b:08x}" for b in normals(*args)))
            else:
                print(f"unknown request {kind!r}", file=sys.stderr)
                return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
