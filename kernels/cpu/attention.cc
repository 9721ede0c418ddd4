#include "kernels/attention.h"

#include "kernels/type_traits.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops_isa.h"
#include "kernels/fp16.h"
#include "kernels/ggml_type.h"
#include "kernels/quant/blocks.h"
#include "kernels/type_traits.h"

namespace fucina {
namespace {

// Keys per tile of the streaming softmax: scores for a tile live on the stack, and a tile of
// K and V rows of one kv head stays in L1 while every query head of its GQA group uses it.
constexpr int kTile = 32;

const uint8_t* HeadRow(const KvLayout& l, const void* cache, int64_t pos, int kvh) {
  return static_cast<const uint8_t*>(cache) + pos * l.PositionBytes() + kvh * l.HeadBytes();
}

// Scalar tile kernels used when ActiveIsa() is kScalar; same contracts as ops_isa.h.
inline float ScalarValue(const float* row, int d) { return row[d]; }
inline float ScalarValue(const f16_t* row, int d) { return Fp16ToFp32(row[d]); }
inline float ScalarValue(const BlockQ8_0* row, int d) {
  const BlockQ8_0& b = row[d / kQK8_0];
  return Fp16ToFp32(b.d) * static_cast<float>(b.qs[d % kQK8_0]);
}

template <typename T>
void ScalarScores(const float* q, const void* k, int64_t stride_bytes, int n_keys, int head_dim,
                  float* s) {
  for (int t = 0; t < n_keys; ++t) {
    const T* row = reinterpret_cast<const T*>(static_cast<const uint8_t*>(k) + t * stride_bytes);
    float sum = 0.0f;
    for (int d = 0; d < head_dim; ++d) sum += q[d] * ScalarValue(row, d);
    s[t] = sum;
  }
}

template <typename T>
void ScalarAccum(const float* p, const void* v, int64_t stride_bytes, int n_keys, int head_dim,
                 float* acc) {
  for (int t = 0; t < n_keys; ++t) {
    const T* row = reinterpret_cast<const T*>(static_cast<const uint8_t*>(v) + t * stride_bytes);
    for (int d = 0; d < head_dim; ++d) acc[d] += p[t] * ScalarValue(row, d);
  }
}

void ScalarExp(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}

struct TileKernels {
  AttnScoresFn scores;
  AttnAccumFn accum;
  void (*exp)(const float* x, float* y, int64_t n);
};

TileKernels SelectKernels(Isa isa, GgmlType type) {
  switch (isa) {
    case Isa::kAvx512:
      if (type == GgmlType::kF16) {
        return {avx512::AttnScoresF16, avx512::AttnAccumF16, avx512::ExpF32};
      }
      if (type == GgmlType::kQ8_0) {
        return {avx512::AttnScoresQ8_0, avx512::AttnAccumQ8_0, avx512::ExpF32};
      }
      return {avx512::AttnScoresF32, avx512::AttnAccumF32, avx512::ExpF32};
    case Isa::kAvx2:
      if (type == GgmlType::kF16) return {avx2::AttnScoresF16, avx2::AttnAccumF16, avx2::ExpF32};
      if (type == GgmlType::kQ8_0) {
        return {avx2::AttnScoresQ8_0, avx2::AttnAccumQ8_0, avx2::ExpF32};
      }
      return {avx2::AttnScoresF32, avx2::AttnAccumF32, avx2::ExpF32};
    case Isa::kScalar:
      break;
  }
  if (type == GgmlType::kF16) return {ScalarScores<f16_t>, ScalarAccum<f16_t>, ScalarExp};
  if (type == GgmlType::kQ8_0) return {ScalarScores<BlockQ8_0>, ScalarAccum<BlockQ8_0>, ScalarExp};
  return {ScalarScores<float>, ScalarAccum<float>, ScalarExp};
}

}  // namespace

absl::Status ValidateKvLayout(const KvLayout& layout) {
  if (layout.type != GgmlType::kF32 && layout.type != GgmlType::kF16 &&
      layout.type != GgmlType::kQ8_0) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache type must be f32, f16 or q8_0, got ",
                     std::string(TypeName(layout.type))));
  }
  if (layout.capacity <= 0 || layout.num_heads_kv <= 0 || layout.head_dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "KV cache sizes must be positive: capacity ", layout.capacity, ", kv heads ",
        layout.num_heads_kv, ", head_dim ", layout.head_dim));
  }
  if (layout.type == GgmlType::kQ8_0 && layout.head_dim % kQK8_0 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("q8_0 KV cache needs head_dim % 32 == 0, got ", layout.head_dim));
  }
  return absl::OkStatus();
}

void StoreKvRows(const KvLayout& layout, void* cache, int64_t pos, int64_t n, const float* src) {
  // The dtype table's converters: plain copy, f16 rounding or ggml's q8_0 rule (bit-exact
  // with the scalar references on every ISA).
  const FromFloatFn convert = GetCpuTraits(layout.type)->from_float;
  const int hd = layout.head_dim;
  for (int64_t r = 0; r < n; ++r) {
    for (int h = 0; h < layout.num_heads_kv; ++h) {
      uint8_t* dst = static_cast<uint8_t*>(cache) + (pos + r) * layout.PositionBytes() +
                     h * layout.HeadBytes();
      convert(src + (r * layout.num_heads_kv + h) * hd, dst, hd);
    }
  }
}

void LoadKvHead(const KvLayout& layout, const void* cache, int64_t pos, int kvh, float* out) {
  const uint8_t* row = HeadRow(layout, cache, pos, kvh);
  for (int d = 0; d < layout.head_dim; ++d) {
    switch (layout.type) {
      case GgmlType::kF16:
        out[d] = ScalarValue(reinterpret_cast<const f16_t*>(row), d);
        break;
      case GgmlType::kQ8_0:
        out[d] = ScalarValue(reinterpret_cast<const BlockQ8_0*>(row), d);
        break;
      default:
        out[d] = ScalarValue(reinterpret_cast<const float*>(row), d);
        break;
    }
  }
}

void AttentionHeads(const AttentionArgs& args, int head_begin, int head_end, float* out) {
  AttentionHeadsForIsa(ActiveIsa(), args, head_begin, head_end, out);
}

void AttentionHeadsForIsa(Isa isa, const AttentionArgs& args, int head_begin, int head_end,
                          float* out) {
  const KvLayout& l = args.layout;
  const int hd = l.head_dim;
  const int group = args.num_heads / l.num_heads_kv;
  const int64_t stride = l.PositionBytes();
  const int64_t head_bytes = l.HeadBytes();
  const TileKernels kern = SelectKernels(isa, l.type);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  // Per query head of one GQA group: scaled query, running max, running sum, accumulator.
  std::vector<float> qs(static_cast<size_t>(group) * hd);
  std::vector<float> acc(static_cast<size_t>(group) * hd);
  std::vector<float> run_max(group), run_sum(group);
  float s[kTile];

  for (int64_t i = 0; i < args.n_q; ++i) {
    const int64_t n_keys = args.pos0 + i + 1;
    int h = head_begin;
    while (h < head_end) {
      const int kvh = h / group;
      const int h_end = std::min(head_end, (kvh + 1) * group);  // heads sharing kv head kvh.
      const int nh = h_end - h;
      for (int g = 0; g < nh; ++g) {
        const float* qrow = args.q + (i * args.num_heads + h + g) * hd;
        for (int d = 0; d < hd; ++d) qs[g * hd + d] = qrow[d] * args.scale;
        std::fill(acc.begin() + g * hd, acc.begin() + (g + 1) * hd, 0.0f);
        run_max[g] = kNegInf;
        run_sum[g] = 0.0f;
      }
      const uint8_t* k_base = HeadRow(l, args.k_cache, 0, kvh);
      const uint8_t* v_base = HeadRow(l, args.v_cache, 0, kvh);
      for (int64_t j0 = 0; j0 < n_keys; j0 += kTile) {
        const int nt = static_cast<int>(std::min<int64_t>(kTile, n_keys - j0));
        // The rows of one kv head are a position apart (all kv heads of a position are
        // contiguous), a stride the hardware prefetchers do not follow: request the next
        // tile's K and V rows while this one is computed.
        const int64_t next = std::min<int64_t>(kTile, n_keys - j0 - nt);
        for (int64_t t = 0; t < next; ++t) {
          const uint8_t* kr = k_base + (j0 + nt + t) * stride;
          const uint8_t* vr = v_base + (j0 + nt + t) * stride;
          for (int64_t o = 0; o < head_bytes; o += 64) {
            __builtin_prefetch(kr + o, 0, 2);
            __builtin_prefetch(vr + o, 0, 2);
          }
        }
        for (int g = 0; g < nh; ++g) {
          float* a = acc.data() + g * hd;
          kern.scores(qs.data() + g * hd, k_base + j0 * stride, stride, nt, hd, s);
          float tile_max = kNegInf;
          for (int t = 0; t < nt; ++t) tile_max = std::max(tile_max, s[t]);
          if (tile_max > run_max[g]) {
            // Rescale what was accumulated under the old maximum (exp(-inf) = 0 on the first
            // tile, when acc and the sum are still zero anyway).
            if (run_sum[g] != 0.0f) {
              const float c = std::exp(run_max[g] - tile_max);
              run_sum[g] *= c;
              for (int d = 0; d < hd; ++d) a[d] *= c;
            }
            run_max[g] = tile_max;
          }
          for (int t = 0; t < nt; ++t) s[t] -= run_max[g];
          kern.exp(s, s, nt);
          for (int t = 0; t < nt; ++t) run_sum[g] += s[t];
          kern.accum(s, v_base + j0 * stride, stride, nt, hd, a);
        }
      }
      for (int g = 0; g < nh; ++g) {
        float* o = out + (i * args.num_heads + h + g) * hd;
        const float inv = 1.0f / run_sum[g];
        for (int d = 0; d < hd; ++d) o[d] = acc[g * hd + d] * inv;
      }
      h = h_end;
    }
  }
}

void Attention(const AttentionArgs& args, float* out) {
  AttentionHeads(args, 0, args.num_heads, out);
}

void AttentionRef(const AttentionArgs& args, float* out) {
  const KvLayout& l = args.layout;
  const int hd = l.head_dim;
  const int group = args.num_heads / l.num_heads_kv;
  std::vector<float> k(hd), v(hd);
  std::vector<double> scores, acc(hd);
  for (int64_t i = 0; i < args.n_q; ++i) {
    const int64_t n_keys = args.pos0 + i + 1;
    scores.assign(static_cast<size_t>(n_keys), 0.0);
    for (int h = 0; h < args.num_heads; ++h) {
      const int kvh = h / group;
      const float* q = args.q + (i * args.num_heads + h) * hd;
      double max = -std::numeric_limits<double>::infinity();
      for (int64_t j = 0; j < n_keys; ++j) {
        LoadKvHead(l, args.k_cache, j, kvh, k.data());
        double dot = 0.0;
        for (int d = 0; d < hd; ++d) dot += static_cast<double>(q[d]) * k[d];
        scores[j] = dot * args.scale;
        max = std::max(max, scores[j]);
      }
      double sum = 0.0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < n_keys; ++j) {
        const double w = std::exp(scores[j] - max);
        sum += w;
        LoadKvHead(l, args.v_cache, j, kvh, v.data());
        for (int d = 0; d < hd; ++d) acc[d] += w * v[d];
      }
      float* o = out + (i * args.num_heads + h) * hd;
      for (int d = 0; d < hd; ++d) o[d] = static_cast<float>(acc[d] / sum);
    }
  }
}

}  // namespace fucina
