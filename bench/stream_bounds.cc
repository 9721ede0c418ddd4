#include "bench/stream_bounds.h"

#include "kernels/cpu/avx512/undefined_vectors.h"  // before any intrinsics: GCC bug 105593

#include <algorithm>
#include <cstdint>

#include <immintrin.h>

#include "kernels/cpu/isa.h"
#include "kernels/fp16.h"
#include "kernels/quant/blocks.h"

namespace fucina::cli {
namespace {

// How far ahead the prefetching read requests lines: 16 KiB measured best among 4-32 KiB on a
// Zen 5 core (8 KiB ~2% less).
constexpr int64_t kReadAhead = 16384 / 8;  // in uint64 words.

// Software prefetch of the 4 lines a read step covers, kReadAhead words on, into L1.
inline void PrefetchReadStep(const uint64_t* p) {
  for (int l = 0; l < 4; ++l) __builtin_prefetch(p + kReadAhead + 8 * l, 0, 3);
}

// Reads [p, p + n) (n a multiple of 64 bytes) as fast as the core can issue loads: widest
// vector loads the CPU has, several independent accumulators, a result the compiler must keep.
__attribute__((target("avx512f"))) uint64_t ReadAvx512(const uint64_t* p, int64_t n,
                                                       bool prefetch) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 32 <= n; i += 32) {
    if (prefetch) PrefetchReadStep(p + i);
    a0 = _mm512_xor_si512(a0, _mm512_loadu_si512(p + i));
    a1 = _mm512_xor_si512(a1, _mm512_loadu_si512(p + i + 8));
    a2 = _mm512_xor_si512(a2, _mm512_loadu_si512(p + i + 16));
    a3 = _mm512_xor_si512(a3, _mm512_loadu_si512(p + i + 24));
  }
  const __m512i a = _mm512_xor_si512(_mm512_xor_si512(a0, a1), _mm512_xor_si512(a2, a3));
  return _mm512_reduce_or_epi64(a);
}

__attribute__((target("avx2"))) uint64_t ReadAvx2(const uint64_t* p, int64_t n, bool prefetch) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 16 <= n; i += 16) {
    if (prefetch && i % 32 == 0) PrefetchReadStep(p + i);
    a0 = _mm256_xor_si256(a0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    a1 = _mm256_xor_si256(a1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
    a2 = _mm256_xor_si256(a2, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    a3 = _mm256_xor_si256(a3, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
  }
  const __m256i a = _mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3));
  return _mm256_extract_epi64(a, 0) | _mm256_extract_epi64(a, 3);
}

uint64_t ReadScalar(const uint64_t* p, int64_t n) {
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  for (int64_t i = 0; i + 4 <= n; i += 4) {
    a0 ^= p[i];
    a1 ^= p[i + 1];
    a2 ^= p[i + 2];
    a3 ^= p[i + 3];
  }
  return a0 ^ a1 ^ a2 ^ a3;
}

}  // namespace

uint64_t ReadRange(const uint64_t* p, int64_t n, bool prefetch) {
  switch (ActiveIsa()) {
    case Isa::kAvx512: return ReadAvx512(p, n, prefetch);
    case Isa::kAvx2: return ReadAvx2(p, n, prefetch);
    case Isa::kScalar: break;
  }
  return ReadScalar(p, n);
}

namespace {

// The streams' loads are the kernels' own: 32 bytes of f16 per vcvtph2ps, a block's 32 quants
// per 256-bit load, 16 quants per sign extension. Each value read enters kH products, one per
// query head of a GQA group (a K value the group's kH query dots, a V value its kH weighted
// sums): kH FMAs per converted vector (kH vpdpbusd per key block), spread round robin over 8
// accumulators so an FMA's latency never paces the loop and it runs at the rate its loads,
// conversions and multiply-adds issue. Heads get distinct weights, so no two products merge.
// (Counting one head, as this bound did before, held a 2-head group's q8_0 attention to a
// stream doing half the multiply-adds the group needs: 26.5 GB/s against 24.3 on a Zen 4 core.)
// Software prefetch distance: without it the conversion streams ran at 55-65% of a plain read on
// 2 threads, with it at ~80%; 2, 6 and 12 KiB measured alike.
constexpr int kAhead = 8192;
constexpr int kAcc = 8;     // accumulators of every stream
constexpr int kUnroll = 8;  // blocks a step of the key streams (AVX2 values: a quarter), so
                            // that every accumulator index is known at compile time

__attribute__((target("avx512f"), always_inline)) inline __m512 HalfVector(const f16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

__attribute__((target("avx512f"), always_inline)) inline __m512 QuantVector(const int8_t* q) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
}

__attribute__((target("avx512f"), always_inline)) inline float SumAcc(const __m512 (&a)[kAcc]) {
  __m512 s = a[0];
  for (int i = 1; i < kAcc; ++i) s = _mm512_add_ps(s, a[i]);
  return _mm512_reduce_add_ps(s);
}

template <int kH>
__attribute__((target("avx512f,avx512vl,avx512vnni,f16c"))) float ConvertF16Avx512(const f16_t* p,
                                                                              int64_t n) {
  __m512 a[kAcc], w[kH];
  for (int i = 0; i < kAcc; ++i) a[i] = _mm512_setzero_ps();
  for (int h = 0; h < kH; ++h) w[h] = _mm512_set1_ps(1.0f + h);
  for (int64_t i = 0; i + 64 <= n; i += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(p + i) + kAhead, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(p + i) + kAhead + 64, _MM_HINT_T0);
    #pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const __m512 x = HalfVector(p + i + 16 * v);
      #pragma GCC unroll 8
      for (int h = 0; h < kH; ++h) {
        __m512& acc = a[(v * kH + h) % kAcc];
        acc = _mm512_fmadd_ps(w[h], x, acc);
      }
    }
  }
  return SumAcc(a);
}

// The sum of every int32 lane of the accumulators (the key-dot streams' end, at either width).
__attribute__((target("avx2"))) int32_t SumAccInt32(const __m256i (&a)[kAcc]) {
  __m256i v = a[0];
  for (int i = 1; i < kAcc; ++i) v = _mm256_add_epi32(v, a[i]);
  const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  return _mm_extract_epi32(s, 0) + _mm_extract_epi32(s, 1) + _mm_extract_epi32(s, 2) +
         _mm_extract_epi32(s, 3);
}

template <int kH>
__attribute__((target("avx512f,avx512vl,avx512vnni,f16c"))) int32_t DotQ8_0Avx512(
    const BlockQ8_0* b, int64_t nb) {
  __m256i a[kAcc], w[kH];
  for (int i = 0; i < kAcc; ++i) a[i] = _mm256_setzero_si256();
  for (int h = 0; h < kH; ++h) w[h] = _mm256_set1_epi8(static_cast<char>(1 + h));
  int64_t i = 0;
  for (; i + kUnroll <= nb; i += kUnroll) {
    #pragma GCC unroll 8
    for (int u = 0; u < kUnroll; ++u) {
      if (u % 2 == 0) {
        _mm_prefetch(reinterpret_cast<const char*>(b + i + u) + kAhead, _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(b + i + u) + kAhead + 64, _MM_HINT_T0);
      }
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i + u].qs));
      #pragma GCC unroll 8
      for (int h = 0; h < kH; ++h) {
        __m256i& acc = a[(u * kH + h) % kAcc];
        acc = _mm256_dpbusd_epi32(acc, w[h], q);
      }
    }
  }
  for (; i < nb; ++i) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qs));
    for (int h = 0; h < kH; ++h) a[0] = _mm256_dpbusd_epi32(a[0], w[h], q);
  }
  return SumAccInt32(a);
}

// A q8_0 value block weighted once per head: its scale times the head's weight, then an FMA
// per 16 values. Made as the kernels make them (ops_avx512.cc, AccumBlock over q8_0 rows):
// the weights of 32 blocks first, 4 blocks' scales picked by one vpermt2w and multiplied 8 at
// a time, one copy per FMA, so each FMA takes its weight as a broadcast operand ({1to16}).
// (Made a block at a time beside its FMAs, the stream ran 28 cycles a 4-block key for a
// 2-head group in L1 on a Zen 4 core; the kernels' loop, weights ahead, ~23.)
constexpr int kWeightBlocks = 32;

template <int kH>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c"))) float DequantQ8_0Avx512(
    const BlockQ8_0* b, int64_t nb) {
  __m512 a[kAcc];
  for (int i = 0; i < kAcc; ++i) a[i] = _mm512_setzero_ps();
  // Words 17 j of 4 blocks (136 bytes from a block's start: only the 4 scale words are read),
  // each twice: lanes 2 j and 2 j + 1 hold block j's scale.
  const __mmask32 words[2] = {(1u << 0) | (1u << 17), (1u << (34 - 32)) | (1u << (51 - 32))};
  alignas(16) static constexpr uint16_t kIndex[8] = {0, 0, 17, 17, 34, 34, 51, 51};
  const __m512i index =
      _mm512_castsi128_si512(_mm_load_si128(reinterpret_cast<const __m128i*>(kIndex)));
  // w[((u / 4) kH + h) 8 + 2 (u % 4) + v]: head h's weight for chunk v of block u.
  alignas(64) float w[kWeightBlocks * kH * 2];
  int64_t i = 0;
  for (; i + kWeightBlocks <= nb; i += kWeightBlocks) {
    for (int u = 0; u < kWeightBlocks; u += 4) {
      const uint8_t* p = reinterpret_cast<const uint8_t*>(b + i + u);
      const __m512i lo = _mm512_maskz_loadu_epi16(words[0], p);
      const __m512i hi = _mm512_maskz_loadu_epi16(words[1], p + 64);
      const __m256 d = _mm256_cvtph_ps(
          _mm512_castsi512_si128(_mm512_permutex2var_epi16(lo, index, hi)));
      #pragma GCC unroll 8
      for (int h = 0; h < kH; ++h) {
        _mm256_store_ps(w + ((u / 4) * kH + h) * 8, _mm256_mul_ps(d, _mm256_set1_ps(1.0f + h)));
      }
    }
    for (int u0 = 0; u0 < kWeightBlocks; u0 += 4) {
      #pragma GCC unroll 4
      for (int u = u0; u < u0 + 4; ++u) {
        if (u % 2 == 0) {
          _mm_prefetch(reinterpret_cast<const char*>(b + i + u) + kAhead, _MM_HINT_T0);
        }
        const __m512 x[2] = {QuantVector(b[i + u].qs), QuantVector(b[i + u].qs + 16)};
        #pragma GCC unroll 8
        for (int h = 0; h < kH; ++h) {
          #pragma GCC unroll 2
          for (int v = 0; v < 2; ++v) {
            __m512& acc = a[((2 * (u - u0) + v) * kH + h) % kAcc];
            acc = _mm512_fmadd_ps(_mm512_set1_ps(w[(u0 / 4 * kH + h) * 8 + 2 * (u - u0) + v]),
                                  x[v], acc);
          }
        }
      }
    }
  }
  for (; i < nb; ++i) {
    const float d = _cvtsh_ss(b[i].d);
    for (int h = 0; h < kH; ++h) {
      const __m512 wd = _mm512_set1_ps(d * (1.0f + h));
      a[0] = _mm512_fmadd_ps(wd, QuantVector(b[i].qs), a[0]);
      a[1] = _mm512_fmadd_ps(wd, QuantVector(b[i].qs + 16), a[1]);
    }
  }
  return SumAcc(a);
}

// The same streams at 256 bits. A key block's dot is llama.cpp's AVX2 one (no vpdpbusd):
// vpmaddubsw of its quants by the head's bytes, then vpmaddwd into int32.
__attribute__((target("avx2,fma,f16c"), always_inline)) inline __m256 HalfVector8(
    const f16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

__attribute__((target("avx2,fma,f16c"), always_inline)) inline __m256 QuantVector8(
    const int8_t* q) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q))));
}

__attribute__((target("avx2,fma,f16c"))) float HorizontalSum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

__attribute__((target("avx2,fma,f16c"), always_inline)) inline float SumAcc8(
    const __m256 (&a)[kAcc]) {
  __m256 s = a[0];
  for (int i = 1; i < kAcc; ++i) s = _mm256_add_ps(s, a[i]);
  return HorizontalSum8(s);
}

template <int kH>
__attribute__((target("avx2,fma,f16c"))) float ConvertF16Avx2(const f16_t* p, int64_t n) {
  __m256 a[kAcc], w[kH];
  for (int i = 0; i < kAcc; ++i) a[i] = _mm256_setzero_ps();
  for (int h = 0; h < kH; ++h) w[h] = _mm256_set1_ps(1.0f + h);
  for (int64_t i = 0; i + 32 <= n; i += 32) {
    _mm_prefetch(reinterpret_cast<const char*>(p + i) + kAhead, _MM_HINT_T0);
    #pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      const __m256 x = HalfVector8(p + i + 8 * v);
      #pragma GCC unroll 8
      for (int h = 0; h < kH; ++h) {
        __m256& acc = a[(v * kH + h) % kAcc];
        acc = _mm256_fmadd_ps(w[h], x, acc);
      }
    }
  }
  return SumAcc8(a);
}

template <int kH>
__attribute__((target("avx2,fma,f16c"))) int32_t DotQ8_0Avx2(const BlockQ8_0* b, int64_t nb) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i a[kAcc];
  for (int i = 0; i < kAcc; ++i) a[i] = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + kUnroll <= nb; i += kUnroll) {
    #pragma GCC unroll 8
    for (int u = 0; u < kUnroll; ++u) {
      if (u % 2 == 0) {
        _mm_prefetch(reinterpret_cast<const char*>(b + i + u) + kAhead, _MM_HINT_T0);
      }
      const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i + u].qs));
      #pragma GCC unroll 8
      for (int h = 0; h < kH; ++h) {
        const __m256i w = _mm256_set1_epi8(static_cast<char>(1 + h));
        __m256i& acc = a[(u * kH + h) % kAcc];
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, q), ones));
      }
    }
  }
  for (; i < nb; ++i) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qs));
    for (int h = 0; h < kH; ++h) {
      const __m256i w = _mm256_set1_epi8(static_cast<char>(1 + h));
      a[0] = _mm256_add_epi32(a[0], _mm256_madd_epi16(_mm256_maddubs_epi16(w, q), ones));
    }
  }
  return SumAccInt32(a);
}

template <int kH>
__attribute__((target("avx2,fma,f16c"))) float DequantQ8_0Avx2(const BlockQ8_0* b, int64_t nb) {
  __m256 a[kAcc];
  for (int i = 0; i < kAcc; ++i) a[i] = _mm256_setzero_ps();
  // Block u of a step: its 4 vectors into accumulators ((4 u + v) kH + h) % kAcc.
  int64_t i = 0;
  for (; i + kUnroll / 4 <= nb; i += kUnroll / 4) {
    #pragma GCC unroll 2
    for (int u = 0; u < kUnroll / 4; ++u) {
      if (u % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(b + i + u) + kAhead, _MM_HINT_T0);
      const float d = _cvtsh_ss(b[i + u].d);
      __m256 x[4];
      #pragma GCC unroll 4
      for (int v = 0; v < 4; ++v) x[v] = QuantVector8(b[i + u].qs + 8 * v);
      #pragma GCC unroll 8
      for (int h = 0; h < kH; ++h) {
        const __m256 wd = _mm256_set1_ps(d * (1.0f + h));
        #pragma GCC unroll 4
        for (int v = 0; v < 4; ++v) {
          __m256& acc = a[((4 * u + v) * kH + h) % kAcc];
          acc = _mm256_fmadd_ps(wd, x[v], acc);
        }
      }
    }
  }
  for (; i < nb; ++i) {
    const float d = _cvtsh_ss(b[i].d);
    for (int h = 0; h < kH; ++h) {
      const __m256 wd = _mm256_set1_ps(d * (1.0f + h));
      for (int v = 0; v < 4; ++v) a[v] = _mm256_fmadd_ps(wd, QuantVector8(b[i].qs + 8 * v), a[v]);
    }
  }
  return SumAcc8(a);
}

// f.template operator()<kH>() for kH = heads (1..8).
template <typename F>
auto ForHeads(int heads, F&& f) {
  switch (heads) {
    case 1: return f.template operator()<1>();
    case 2: return f.template operator()<2>();
    case 3: return f.template operator()<3>();
    case 4: return f.template operator()<4>();
    case 5: return f.template operator()<5>();
    case 6: return f.template operator()<6>();
    case 7: return f.template operator()<7>();
    default: return f.template operator()<8>();
  }
}

}  // namespace

bool HasConversionStreams() { return ActiveIsa() != Isa::kScalar; }

float ConvertF16Stream(const f16_t* p, int64_t n, int heads, Isa isa) {
  heads = std::clamp(heads, 1, 8);
  if (isa == Isa::kAvx512) {
    return ForHeads(heads, [&]<int kH>() { return ConvertF16Avx512<kH>(p, n); });
  }
  if (isa == Isa::kAvx2) {
    return ForHeads(heads, [&]<int kH>() { return ConvertF16Avx2<kH>(p, n); });
  }
  float s = 0.0f;
  for (int64_t i = 0; i < n / 64 * 64; ++i) {
    for (int h = 0; h < heads; ++h) s += (1.0f + h) * Fp16ToFp32(p[i]);
  }
  return s;
}

int32_t DotQ8_0Stream(const BlockQ8_0* blocks, int64_t nb, int heads, Isa isa) {
  heads = std::clamp(heads, 1, 8);
  if (isa == Isa::kAvx512) {
    return ForHeads(heads, [&]<int kH>() { return DotQ8_0Avx512<kH>(blocks, nb); });
  }
  if (isa == Isa::kAvx2) {
    return ForHeads(heads, [&]<int kH>() { return DotQ8_0Avx2<kH>(blocks, nb); });
  }
  int32_t s = 0;
  for (int64_t i = 0; i < nb; ++i) {
    for (int8_t q : blocks[i].qs) {
      for (int h = 0; h < heads; ++h) s += (1 + h) * q;
    }
  }
  return s;
}

float DequantQ8_0Stream(const BlockQ8_0* blocks, int64_t nb, int heads, Isa isa) {
  heads = std::clamp(heads, 1, 8);
  if (isa == Isa::kAvx512) {
    return ForHeads(heads, [&]<int kH>() { return DequantQ8_0Avx512<kH>(blocks, nb); });
  }
  if (isa == Isa::kAvx2) {
    return ForHeads(heads, [&]<int kH>() { return DequantQ8_0Avx2<kH>(blocks, nb); });
  }
  float s = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const float d = Fp16ToFp32(blocks[i].d);
    for (int8_t q : blocks[i].qs) {
      for (int h = 0; h < heads; ++h) s += (1.0f + h) * d * q;
    }
  }
  return s;
}

}  // namespace fucina::cli
