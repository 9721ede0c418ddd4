#include "bench/stream_bounds.h"

#include "kernels/cpu/avx512/undefined_vectors.h"  // before any intrinsics: GCC bug 105593

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
// per 256-bit load, 16 quants per sign extension. Four (two) accumulators keep the adds off
// the critical path, so the loop runs at the rate its loads and conversions issue.
// Software prefetch distance: without it the conversion streams ran at 55-65% of a plain read on
// 2 threads, with it at ~80%; 2, 6 and 12 KiB measured alike.
constexpr int kAhead = 8192;

__attribute__((target("avx512f"), always_inline)) inline __m512 HalfVector(const f16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

__attribute__((target("avx512f"), always_inline)) inline __m512 QuantVector(const int8_t* q) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q))));
}

__attribute__((target("avx512f,avx512vl,avx512vnni,f16c"))) float ConvertF16Avx512(const f16_t* p,
                                                                              int64_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 64 <= n; i += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(p + i) + kAhead, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(p + i) + kAhead + 64, _MM_HINT_T0);
    a0 = _mm512_add_ps(a0, HalfVector(p + i));
    a1 = _mm512_add_ps(a1, HalfVector(p + i + 16));
    a2 = _mm512_add_ps(a2, HalfVector(p + i + 32));
    a3 = _mm512_add_ps(a3, HalfVector(p + i + 48));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

// The sum of v's 8 int32 lanes (the key-dot streams' end, at either width).
__attribute__((target("avx2"))) int32_t SumInt32(__m256i v) {
  const __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  return _mm_extract_epi32(s, 0) + _mm_extract_epi32(s, 1) + _mm_extract_epi32(s, 2) +
         _mm_extract_epi32(s, 3);
}

__attribute__((target("avx512f,avx512vl,avx512vnni,f16c"))) int32_t DotQ8_0Avx512(
    const BlockQ8_0* b, int64_t nb) {
  const __m256i ones = _mm256_set1_epi8(1);
  __m256i a0 = _mm256_setzero_si256(), a1 = a0;
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    _mm_prefetch(reinterpret_cast<const char*>(b + i) + kAhead, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(b + i) + kAhead + 64, _MM_HINT_T0);
    a0 = _mm256_dpbusd_epi32(a0, ones,
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qs)));
    a1 = _mm256_dpbusd_epi32(a1, ones,
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i + 1].qs)));
  }
  if (i < nb) {
    a0 = _mm256_dpbusd_epi32(a0, ones,
                             _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[i].qs)));
  }
  return SumInt32(_mm256_add_epi32(a0, a1));
}

__attribute__((target("avx512f,avx512vl,avx512vnni,f16c"))) float DequantQ8_0Avx512(
    const BlockQ8_0* b, int64_t nb) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0;
  for (int64_t i = 0; i < nb; ++i) {
    if (i % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(b + i) + kAhead, _MM_HINT_T0);
    const __m512 d = _mm512_set1_ps(_cvtsh_ss(b[i].d));
    a0 = _mm512_fmadd_ps(d, QuantVector(b[i].qs), a0);
    a1 = _mm512_fmadd_ps(d, QuantVector(b[i].qs + 16), a1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
}

// The same streams at 256 bits. A key block's dot is llama.cpp's AVX2 one (no vpdpbusd):
// vpmaddubsw of its quants by ones, then vpmaddwd into int32.
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

__attribute__((target("avx2,fma,f16c"))) float ConvertF16Avx2(const f16_t* p, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (int64_t i = 0; i + 32 <= n; i += 32) {
    _mm_prefetch(reinterpret_cast<const char*>(p + i) + kAhead, _MM_HINT_T0);
    a0 = _mm256_add_ps(a0, HalfVector8(p + i));
    a1 = _mm256_add_ps(a1, HalfVector8(p + i + 8));
    a2 = _mm256_add_ps(a2, HalfVector8(p + i + 16));
    a3 = _mm256_add_ps(a3, HalfVector8(p + i + 24));
  }
  return HorizontalSum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}

__attribute__((target("avx2,fma,f16c"), always_inline)) inline __m256i BlockDot8(
    const BlockQ8_0& block) {
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block.qs));
  return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
}

__attribute__((target("avx2,fma,f16c"))) int32_t DotQ8_0Avx2(const BlockQ8_0* b, int64_t nb) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0;
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    _mm_prefetch(reinterpret_cast<const char*>(b + i) + kAhead, _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(b + i) + kAhead + 64, _MM_HINT_T0);
    a0 = _mm256_add_epi32(a0, BlockDot8(b[i]));
    a1 = _mm256_add_epi32(a1, BlockDot8(b[i + 1]));
  }
  if (i < nb) a0 = _mm256_add_epi32(a0, BlockDot8(b[i]));
  return SumInt32(_mm256_add_epi32(a0, a1));
}

__attribute__((target("avx2,fma,f16c"))) float DequantQ8_0Avx2(const BlockQ8_0* b, int64_t nb) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0;
  for (int64_t i = 0; i < nb; ++i) {
    if (i % 2 == 0) _mm_prefetch(reinterpret_cast<const char*>(b + i) + kAhead, _MM_HINT_T0);
    const __m256 d = _mm256_set1_ps(_cvtsh_ss(b[i].d));
    a0 = _mm256_fmadd_ps(d, QuantVector8(b[i].qs), a0);
    a1 = _mm256_fmadd_ps(d, QuantVector8(b[i].qs + 8), a1);
    a0 = _mm256_fmadd_ps(d, QuantVector8(b[i].qs + 16), a0);
    a1 = _mm256_fmadd_ps(d, QuantVector8(b[i].qs + 24), a1);
  }
  return HorizontalSum8(_mm256_add_ps(a0, a1));
}

}  // namespace

bool HasConversionStreams() { return ActiveIsa() != Isa::kScalar; }

float ConvertF16Stream(const f16_t* p, int64_t n) {
  if (ActiveIsa() == Isa::kAvx512) return ConvertF16Avx512(p, n);
  if (ActiveIsa() == Isa::kAvx2) return ConvertF16Avx2(p, n);
  float s = 0.0f;
  for (int64_t i = 0; i < n / 64 * 64; ++i) s += Fp16ToFp32(p[i]);
  return s;
}

int32_t DotQ8_0Stream(const BlockQ8_0* blocks, int64_t nb) {
  if (ActiveIsa() == Isa::kAvx512) return DotQ8_0Avx512(blocks, nb);
  if (ActiveIsa() == Isa::kAvx2) return DotQ8_0Avx2(blocks, nb);
  int32_t s = 0;
  for (int64_t i = 0; i < nb; ++i) {
    for (int8_t q : blocks[i].qs) s += q;
  }
  return s;
}

float DequantQ8_0Stream(const BlockQ8_0* blocks, int64_t nb) {
  if (ActiveIsa() == Isa::kAvx512) return DequantQ8_0Avx512(blocks, nb);
  if (ActiveIsa() == Isa::kAvx2) return DequantQ8_0Avx2(blocks, nb);
  float s = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const float d = Fp16ToFp32(blocks[i].d);
    for (int8_t q : blocks[i].qs) s += d * q;
  }
  return s;
}

}  // namespace fucina::cli
