// Scalar references for the k-quants: dequantization and the Q*_K x Q8_K dot products.
//
// Both follow ggml's reference C operation for operation (dequantize_row_q*_K and the generic
// ggml_vec_dot_q*_K_q8_K), including the order of float operations, so results are bit-exact
// with ggml built without FMA contraction. The quantizers live in k_quants_search.cc.
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/fp16.h"
#include "kernels/quant/blocks.h"
#include "kernels/quant/k_quants.h"

namespace fucina {
namespace {

// Sub-block j's 6-bit scale and min from the 12 packed bytes of Q4_K / Q5_K:
// bytes 0..3 hold scales 0..3 (low 6 bits), bytes 4..7 mins 0..3; scales/mins 4..7 keep their
// low 4 bits in bytes 8..11 and their top 2 bits in the spare top bits of bytes 0..7.
inline void GetScaleMinK4(int j, const uint8_t* q, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// All eight scales and mins of a Q4_K / Q5_K super-block.
inline void UnpackScalesMins(const uint8_t* packed, uint8_t scales[8], uint8_t mins[8]) {
  for (int j = 0; j < 8; ++j) GetScaleMinK4(j, packed, &scales[j], &mins[j]);
}

// The dots accumulate integer products in 8 lanes (element index mod 8) and fold each lane
// into its own float sum once per super-block, exactly as ggml's generic code does; keeping
// the same lanes keeps the float rounding identical.
constexpr int kLanes = 8;

// The 5th bit of Q5_K element l of a 32-element run, selected by m, as +16; Q4_K has none.
template <typename Block>
inline int HighBit(const Block& b, int l, uint8_t m) {
  if constexpr (std::is_same_v<Block, BlockQ5_K>) {
    return b.qh[l] & m ? 16 : 0;
  } else {
    return 0;
  }
}

// Q4_K and Q5_K: each 32 bytes of qs hold two sub-blocks, low nibbles first, then high
// nibbles; Q5_K's sub-block s takes its 5th bit from bit s of qh[l].
template <typename Block>
void DequantizeQ4Q5_K(const Block* x, float* y, int64_t n) {
  const int64_t nb = n / kQK_K;
  for (int64_t i = 0; i < nb; ++i) {
    const float d = Fp16ToFp32(x[i].d);
    const float dmin = Fp16ToFp32(x[i].dmin);
    const uint8_t* q = x[i].qs;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < kQK_K / 64; ++j) {
      uint8_t sc, m;
      GetScaleMinK4(2 * j, x[i].scales, &sc, &m);
      const float d1 = d * sc;
      const float m1 = dmin * m;
      GetScaleMinK4(2 * j + 1, x[i].scales, &sc, &m);
      const float d2 = d * sc;
      const float m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * ((q[l] & 0xF) + HighBit(x[i], l, u1)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * ((q[l] >> 4) + HighBit(x[i], l, u2)) - m2;
      q += 32;
      u1 <<= 2;
      u2 <<= 2;
    }
  }
}

}  // namespace

void DequantizeRowQ4_K(const BlockQ4_K* x, float* y, int64_t n) { DequantizeQ4Q5_K(x, y, n); }

void DequantizeRowQ5_K(const BlockQ5_K* x, float* y, int64_t n) { DequantizeQ4Q5_K(x, y, n); }

void DequantizeRowQ6_K(const BlockQ6_K* x, float* y, int64_t n) {
  const int64_t nb = n / kQK_K;
  for (int64_t i = 0; i < nb; ++i) {
    const float d = Fp16ToFp32(x[i].d);
    const uint8_t* ql = x[i].ql;
    const uint8_t* qh = x[i].qh;
    const int8_t* sc = x[i].scales;
    // Each half (128 elements) uses 64 bytes of ql and 32 of qh: element l + 32k takes the
    // nibble (k even: low, k odd: high) of ql[l + 32*(k&1)] and bits 2k..2k+1 of qh[l].
    for (int half = 0; half < 2; ++half) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int8_t q1 = static_cast<int8_t>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int8_t q2 = static_cast<int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int8_t q3 = static_cast<int8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int8_t q4 = static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = d * sc[is + 0] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

void DequantizeRowQ8_K(const BlockQ8_K* x, float* y, int64_t n) {
  const int64_t nb = n / kQK_K;
  for (int64_t i = 0; i < nb; ++i) {
    for (int j = 0; j < kQK_K; ++j) *y++ = x[i].d * x[i].qs[j];
  }
}

namespace {

// Shared body of the Q4_K and Q5_K dots once the weights are unpacked to bytes `a` (values
// 0..15 or 0..31): sum_j scale_j * <a_j, q8_j> in 8 integer lanes, and the min term from the
// activations' 16-element sums.
inline void AccumulateQx_K(const int8_t* a, const uint8_t* packed_scales, const BlockQ8_K& y,
                           f16_t d16, f16_t dmin16, float sums[kLanes], float* sumf) {
  uint8_t scales[8], mins[8];
  UnpackScalesMins(packed_scales, scales, mins);
  int sumi = 0;
  for (int j = 0; j < kQK_K / 16; ++j) sumi += y.bsums[j] * mins[j / 2];
  int32_t aux32[kLanes] = {};
  const int8_t* q8 = y.qs;
  for (int j = 0; j < kQK_K / 32; ++j) {
    const int32_t scale = scales[j];
    for (int k = 0; k < 4; ++k) {
      for (int l = 0; l < kLanes; ++l) {
        const int16_t prod = static_cast<int16_t>(q8[l] * a[l]);
        aux32[l] += scale * prod;
      }
      q8 += 8;
      a += 8;
    }
  }
  const float d = Fp16ToFp32(d16) * y.d;
  for (int l = 0; l < kLanes; ++l) sums[l] += d * aux32[l];
  const float dmin = Fp16ToFp32(dmin16) * y.d;
  *sumf -= dmin * sumi;
}

// The Q4_K and Q5_K dots: unpack each super-block's nibbles (plus the 5th bits for Q5_K) to
// bytes, then AccumulateQx_K.
template <typename Block>
float DotQ4Q5_K(int64_t n, const Block* x, const BlockQ8_K* y) {
  const int64_t nb = n / kQK_K;
  float sums[kLanes] = {};
  float sumf = 0;
  int8_t aux8[kQK_K];
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* q4 = x[i].qs;
    int8_t* a = aux8;
    uint8_t m = 1;
    for (int j = 0; j < kQK_K / 64; ++j) {
      for (int l = 0; l < 32; ++l) a[l] = static_cast<int8_t>((q4[l] & 0xF) + HighBit(x[i], l, m));
      a += 32;
      m <<= 1;
      for (int l = 0; l < 32; ++l) a[l] = static_cast<int8_t>((q4[l] >> 4) + HighBit(x[i], l, m));
      a += 32;
      m <<= 1;
      q4 += 32;
    }
    AccumulateQx_K(aux8, x[i].scales, y[i], x[i].d, x[i].dmin, sums, &sumf);
  }
  for (int l = 0; l < kLanes; ++l) sumf += sums[l];
  return sumf;
}

}  // namespace

float VecDotQ4_KQ8_K(int64_t n, const BlockQ4_K* x, const BlockQ8_K* y) {
  return DotQ4Q5_K(n, x, y);
}

float VecDotQ5_KQ8_K(int64_t n, const BlockQ5_K* x, const BlockQ8_K* y) {
  return DotQ4Q5_K(n, x, y);
}

float VecDotQ6_KQ8_K(int64_t n, const BlockQ6_K* x, const BlockQ8_K* y) {
  const int64_t nb = n / kQK_K;
  float sums[kLanes] = {};
  float sumf = 0;
  int8_t aux8[kQK_K];
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* ql = x[i].ql;
    const uint8_t* qh = x[i].qh;
    int8_t* a = aux8;
    for (int half = 0; half < 2; ++half) {
      for (int l = 0; l < 32; ++l) {
        a[l + 0] = static_cast<int8_t>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        a[l + 32] = static_cast<int8_t>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        a[l + 64] = static_cast<int8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        a[l + 96] = static_cast<int8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      }
      a += 128;
      ql += 64;
      qh += 32;
    }
    int32_t aux32[kLanes] = {};
    const int8_t* q8 = y[i].qs;
    a = aux8;
    for (int j = 0; j < kQK_K / 16; ++j) {
      const int scale = x[i].scales[j];
      for (int k = 0; k < 2; ++k) {
        for (int l = 0; l < kLanes; ++l) {
          const int16_t prod = static_cast<int16_t>(q8[l] * a[l]);
          aux32[l] += scale * prod;
        }
        q8 += 8;
        a += 8;
      }
    }
    const float d = Fp16ToFp32(x[i].d) * y[i].d;
    for (int l = 0; l < kLanes; ++l) sums[l] += d * aux32[l];
  }
  for (int l = 0; l < kLanes; ++l) sumf += sums[l];
  return sumf;
}

}  // namespace fucina
