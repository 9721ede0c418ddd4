"""Independent re-implementation of fucina::Rng (models/sampler/rng.h) for sampler_test.

Usage: rng_ref.py SEED COUNT   (SEED and COUNT in decimal)
Prints COUNT lines "<NextU64 in hex> <NextFloat as a decimal fraction of 2**24>" for a fresh
generator seeded with SEED, i.e. "0x... k" where NextFloat = k / 2**24.

Usage: rng_ref.py position SEED COUNT
Prints COUNT lines "k": PositionDraw(SEED, p) = k / 2**24 for positions p = 0 .. COUNT - 1.
"""
import sys

MASK = (1 << 64) - 1


def splitmix64(state):
    state = (state + 0x9E3779B97F4A7C15) & MASK
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return state, z ^ (z >> 31)


def rotl(x, k):
    return ((x << k) | (x >> (64 - k))) & MASK


def outputs(seed, count):
    s = []
    state = seed & MASK
    for _ in range(4):
        state, out = splitmix64(state)
        s.append(out)
    for _ in range(count):
        out = (rotl((s[1] * 5) & MASK, 7) * 9) & MASK
        t = (s[1] << 17) & MASK
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = rotl(s[3], 45)
        yield out


def main():
    if sys.argv[1] == "position":
        seed, count = int(sys.argv[2]), int(sys.argv[3])
        for p in range(count):
            _, key = splitmix64(p)
            print(next(outputs(seed ^ key, 1)) >> 40)
        return
    seed, count = int(sys.argv[1]), int(sys.argv[2])
    for out in outputs(seed, count):
        print(f"0x{out:016x} {out >> 40}")


if __name__ == "__main__":
    main()
