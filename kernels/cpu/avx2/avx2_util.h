// Private to the SIMD kernels: small register helpers shared by the AVX2 kernels
// (quant_legacy_avx2.cc, k_quants_avx2.cc, gemm_tiles_avx2.cc, ...) and the 256-bit steps of
// AVX-512 ones (gemm_avx512.cc).
//
// Everything here is `static inline` (internal linkage): the including files are compiled with
// -mavx2 -mfma -mf16c, and an ordinary inline function would let the linker keep one
// AVX2-compiled copy for the whole program (see docs/kernels.md). always_inline because the
// tile kernels rely on these disappearing into their loops.
#ifndef FUCINA_KERNELS_CPU_AVX2_AVX2_UTIL_H_
#define FUCINA_KERNELS_CPU_AVX2_AVX2_UTIL_H_

#include <immintrin.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace fucina::avx2 {

#define FUCINA_AVX2_INLINE static inline __attribute__((always_inline))

FUCINA_AVX2_INLINE float HorizontalSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

FUCINA_AVX2_INLINE float HorizontalMax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// ((v0 + v4) + (v1 + v5)) + ((v2 + v6) + (v3 + v7)): the order of ExpF32's sum (ops_isa.h).
FUCINA_AVX2_INLINE float SpanOrderSum(__m256 v) {
  const __m128 c = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 e = _mm_add_ps(c, _mm_shuffle_ps(c, c, _MM_SHUFFLE(2, 3, 0, 1)));  // c0+c1, c2+c3
  return _mm_cvtss_f32(_mm_add_ss(e, _mm_movehl_ps(e, e)));
}

// Sum of the 8 int32 lanes (wraps like int32 addition; callers' sums fit).
FUCINA_AVX2_INLINE int32_t HorizontalSum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(s);
}

// Q4_K dots on AVX2, row-major and kTiles16 kernels alike: per super-block, the exact integer
// sums isum = sum_j scale_j * <q_j, y_j> and msum = sum_j min_j * sum(y_j) go into one float
// per (row, column), a = a + isum * d, then a = a - msum * dmin, one rounding each (d and dmin:
// the weight's times the activation's d), in chunks of kKDotChunk super-blocks, each summed
// from zero and then added to the total. (The tile kernel's passes are those chunks; a
// per-lane order would differ between rows in lanes and positions in lanes.)
constexpr int64_t kKDotChunk = 16;

FUCINA_AVX2_INLINE float KDotStep(float a, int32_t isum, int32_t msum, float d, float dmin) {
  const __m128 r = _mm_fmadd_ss(_mm_cvtsi32_ss(_mm_setzero_ps(), isum), _mm_set_ss(d),
                                _mm_set_ss(a));
  return _mm_cvtss_f32(
      _mm_fnmadd_ss(_mm_cvtsi32_ss(_mm_setzero_ps(), msum), _mm_set_ss(dmin), r));
}

FUCINA_AVX2_INLINE __m256i Load32(const void* p) {
  return _mm256_loadu_si256(static_cast<const __m256i*>(p));
}

// Sum of the 32 int8 at qs (a Q8 block's quants): vpsadbw sums the bytes with their sign bit
// flipped (y + 128), less 32 * 128.
FUCINA_AVX2_INLINE int SumInt8x32(const int8_t* qs) {
  const __m256i u = _mm256_xor_si256(Load32(qs), _mm256_set1_epi8(static_cast<char>(0x80)));
  const __m256i s4 = _mm256_sad_epu8(u, _mm256_setzero_si256());
  const __m128i s2 = _mm_add_epi64(_mm256_castsi256_si128(s4), _mm256_extracti128_si256(s4, 1));
  return static_cast<int>(_mm_cvtsi128_si64(s2) + _mm_extract_epi64(s2, 1)) - 32 * 128;
}

// 16 packed bytes -> 32 bytes: low nibbles (elements 0..15), then high nibbles (16..31).
// The 16 bytes are broadcast to both halves by the load itself and the high half shifted by 4
// (a 32-bit shift: bits crossing into a byte from its neighbour are masked off), which keeps
// the lane-crossing insert off the one shuffle port of Zen 2/3 cores.
FUCINA_AVX2_INLINE __m256i UnpackNibbles(const uint8_t* qs) {
  const __m256i t =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  return _mm256_and_si256(_mm256_srlv_epi32(t, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4)),
                          _mm256_set1_epi8(0x0F));
}

// Byte j = 0xFF where bit j of the little-endian qh is set, else 0.
FUCINA_AVX2_INLINE __m256i BytesFromBits(const uint8_t qh[4]) {
  uint32_t bits;
  std::memcpy(&bits, qh, sizeof(bits));
  const __m256i byte_of_bit = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                0x0101010101010101, 0x0000000000000000);
  const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)), byte_of_bit);
  // Byte j keeps only bit j % 8 clear; it becomes all-ones iff that bit was set.
  const __m256i others = _mm256_set1_epi64x(0x7FBFDFEFF7FBFDFE);
  return _mm256_cmpeq_epi8(_mm256_or_si256(bytes, others), _mm256_set1_epi64x(-1));
}

// A 64-byte aligned per-thread buffer of at least `bytes`, grow-only (freed at thread exit);
// null if the allocation fails. One per including file (internal linkage): ISA files keep to
// the C allocator rather than instantiating STL containers.
FUCINA_AVX2_INLINE void* ThreadScratch(size_t bytes) {
  struct Buffer {
    void* p = nullptr;
    size_t size = 0;
    ~Buffer() { std::free(p); }
  };
  thread_local Buffer buf;
  if (buf.size < bytes) {
    std::free(buf.p);
    buf.size = (bytes + 4095) & ~size_t{4095};
    buf.p = std::aligned_alloc(64, buf.size);
    if (buf.p == nullptr) buf.size = 0;
  }
  return buf.p;
}

// Attention's software prefetch along a KV head's span (ops_avx2.cc, ops_avx512.cc): cache rows
// are read once per token in position order, so the kernels request the span kRowsAhead bytes
// past the rows they read (4-12 KiB and the L2 hints measured alike).
constexpr int64_t kRowsAhead = 6144;

// How a kernel spreads the prefetch of a few rows over its n steps: `per` lines a step, of
// `lines`. Made once per call: divided per step, the counts ran through idiv on the FMA port.
struct PrefetchPlan {
  int64_t lines = 0;
  int64_t per = 0;
};

FUCINA_AVX2_INLINE PrefetchPlan PlanRows(int64_t bytes, int n) {
  const int64_t lines = (bytes + 63) / 64;
  return {lines, (lines + n - 1) / n};
}

// Step i of `plan` over the rows from `rows` on, kRowsAhead further on (prefetches never
// fault).
FUCINA_AVX2_INLINE void PrefetchRows(const void* rows, const PrefetchPlan& plan, int i) {
  const char* p = static_cast<const char*>(rows) + kRowsAhead;
  const int64_t stop = (i + 1) * plan.per;  // no std::min in ISA files (docs/kernels.md)
  const int64_t end = stop < plan.lines ? stop : plan.lines;
  for (int64_t l = i * plan.per; l < end; ++l) _mm_prefetch(p + 64 * l, _MM_HINT_T0);
}

#undef FUCINA_AVX2_INLINE

}  // namespace fucina::avx2

#endif  // FUCINA_KERNELS_CPU_AVX2_AVX2_UTIL_H_
