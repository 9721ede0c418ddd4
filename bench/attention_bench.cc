#include "bench/attention_bench.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/best_rate.h"
#include "bench/stream_bounds.h"
#include "kernels/attention.h"
#include "kernels/cpu/streamed_memory.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/fp16.h"
#include "kernels/ggml_type.h"
#include "kernels/quant/blocks.h"

namespace fucina::cli {
namespace {

// The caches of `layers` layers, K then V per layer, 64-byte aligned and laid out as KvCache
// lays them out (a q8_0 K in tiles where KeyTilesApply).
struct LayerCaches {
  KvLayout layout;  // V's; K's but for tiles16
  bool k_tiles16 = false;
  int layers = 0;
  StreamedBuffer buffer;  // the KV cache's own kind of memory (huge pages)
  uint8_t* base = nullptr;

  const uint8_t* K(int l) const { return base + 2 * l * layout.TotalBytes(); }
  const uint8_t* V(int l) const { return K(l) + layout.TotalBytes(); }
};

LayerCaches MakeCaches(const DecodeAttentionShape& shape, GgmlType type, int64_t working_set) {
  LayerCaches c;
  // Whole attention tiles (32 positions), as KvCache's rings are.
  c.layout = {type, (shape.context + 31) / 32 * 32, shape.num_heads_kv, shape.head_dim};
  c.k_tiles16 = KeyTilesApply(type);
  const int64_t per_layer = 2 * c.layout.TotalBytes();
  c.layers = static_cast<int>(std::max<int64_t>(2, (working_set + per_layer - 1) / per_layer));
  absl::StatusOr<StreamedBuffer> buffer = StreamedBuffer::Create(per_layer * c.layers);
  if (!buffer.ok()) {
    std::fprintf(stderr, "KV caches: %s\n", std::string(buffer.status().message()).c_str());
    std::exit(1);
  }
  c.buffer = *std::move(buffer);
  c.base = c.buffer.data();
  // One layer from normal rows (scaled like real keys and values), copied to the others.
  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  std::vector<float> rows(shape.context * shape.num_heads_kv * shape.head_dim);
  for (int part = 0; part < 2; ++part) {
    for (float& x : rows) x = nd(rng);
    KvLayout l = c.layout;
    l.tiles16 = part == 0 && c.k_tiles16;
    StoreKvRows(l, c.base + part * c.layout.TotalBytes(), 0, shape.context, rows.data());
  }
  for (int l = 1; l < c.layers; ++l) std::memcpy(c.base + l * per_layer, c.base, per_layer);
  return c;
}

// Best GB/s of K+V bytes over repeated passes of fn(layer, kv_head) across every layer, kv
// heads split over the pool's threads as the engine splits them.
template <typename Fn>
double PassGbps(const LayerCaches& c, int64_t context, ThreadPool& pool, double min_seconds,
                Fn&& fn) {
  const int heads = c.layout.num_heads_kv;
  const double bytes = 2.0 * c.layers * heads * context * c.layout.HeadBytes();
  std::vector<double> sinks(static_cast<size_t>(pool.num_threads()) * 8);
  const double best = BestRate(bytes / 1e9, min_seconds, [&] {
    for (int l = 0; l < c.layers; ++l) {
      pool.ParallelFor(heads, 1, [&](int64_t b, int64_t e, int thread) {
        for (int64_t h = b; h < e; ++h) sinks[thread * 8] += fn(l, static_cast<int>(h));
      });
    }
  });
  volatile double keep = sinks[0];  // the streams' results stay observable.
  (void)keep;
  return best;
}

struct Rates {
  double read = 0, convert = 0, attention = 0;
};

Rates Measure(const DecodeAttentionShape& shape, const LayerCaches& c, ThreadPool& pool,
              double min_seconds) {
  const KvLayout& l = c.layout;
  const int64_t span = shape.context * l.HeadBytes();  // bytes of one kv head's K (or V).
  const int64_t values = shape.context * shape.head_dim;
  const int group = shape.num_heads / shape.num_heads_kv;  // query heads per kv head
  auto k_span = [&](int layer, int h) { return c.K(layer) + l.RowOffset(0, h); };
  auto v_span = [&](int layer, int h) { return c.V(layer) + l.RowOffset(0, h); };
  Rates r;
  for (const bool prefetch : {false, true}) {
    r.read = std::max(r.read, PassGbps(c, shape.context, pool, min_seconds, [&](int layer, int h) {
      return static_cast<double>(
          ReadRange(reinterpret_cast<const uint64_t*>(k_span(layer, h)), span / 8, prefetch) ^
          ReadRange(reinterpret_cast<const uint64_t*>(v_span(layer, h)), span / 8, prefetch));
    }));
  }
  if (HasConversionStreams()) {
    r.convert = PassGbps(c, shape.context, pool, min_seconds, [&](int layer, int h) -> double {
      if (l.type == GgmlType::kF16) {
        return ConvertF16Stream(reinterpret_cast<const f16_t*>(k_span(layer, h)), values, group) +
               ConvertF16Stream(reinterpret_cast<const f16_t*>(v_span(layer, h)), values, group);
      }
      const int64_t nb = values / kQK8_0;
      return DotQ8_0Stream(reinterpret_cast<const BlockQ8_0*>(k_span(layer, h)), nb, group) +
             DequantQ8_0Stream(reinterpret_cast<const BlockQ8_0*>(v_span(layer, h)), nb, group);
    });
  }
  // One decode query per query head at the last position: it sees the whole context.
  std::mt19937 rng(11);
  std::normal_distribution<float> nd;
  std::vector<float> q(shape.num_heads * shape.head_dim);
  for (float& x : q) x = nd(rng);
  std::vector<float> out(q.size() * pool.num_threads());
  r.attention = PassGbps(c, shape.context, pool, min_seconds, [&](int layer, int h) {
    AttentionArgs args;
    args.q = q.data();
    args.n_q = 1;
    args.pos0 = shape.context - 1;
    args.num_heads = shape.num_heads;
    args.scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
    args.layout = l;
    args.k_tiles16 = c.k_tiles16;
    args.k_cache = c.K(layer);
    args.v_cache = c.V(layer);
    AttentionHeads(args, h * group, (h + 1) * group, out.data());
    return static_cast<double>(out[h * group * shape.head_dim]);
  });
  return r;
}

}  // namespace

void ReportDecodeAttention(const DecodeAttentionShape& shape, int64_t working_set_bytes,
                           ThreadPool& one, ThreadPool& all, double min_seconds) {
  std::printf("\ndecode attention: one query per head after %lld positions, %d query heads on %d "
              "kv heads of %d dims, GB/s of K+V read; bounds: rd = plain read of the same "
              "spans, cvt = the least arithmetic the type needs (f16: vcvtph2ps; q8_0: K "
              "integer dot, V to f32; then one multiply-add per query head of a kv head)%s\n",
              static_cast<long long>(shape.context), shape.num_heads, shape.num_heads_kv,
              shape.head_dim, HasConversionStreams() ? "" : " (cvt: SIMD levels only, n/a here)");
  std::printf("%-8s %6s | %7s %7s %7s %5s %5s | %7s %7s %7s %5s %5s\n", "kv", "layers", "rd1",
              "cvt1", "attn1", "%rd", "%cvt", "rdN", "cvtN", "attnN", "%rd", "%cvt");
  for (const GgmlType type : {GgmlType::kF16, GgmlType::kQ8_0}) {
    const LayerCaches caches = MakeCaches(shape, type, working_set_bytes);
    const Rates r1 = Measure(shape, caches, one, min_seconds);
    const Rates rn = Measure(shape, caches, all, min_seconds);
    auto share = [](double a, double b) { return b > 0 ? 100.0 * a / b : 0.0; };
    std::printf("%-8s %6d | %7.2f %7.2f %7.2f %4.0f%% %4.0f%% | %7.2f %7.2f %7.2f %4.0f%% "
                "%4.0f%%\n",
                std::string(TypeName(type)).c_str(), caches.layers, r1.read, r1.convert,
                r1.attention, share(r1.attention, r1.read), share(r1.attention, r1.convert),
                rn.read, rn.convert, rn.attention, share(rn.attention, rn.read),
                share(rn.attention, rn.convert));
    std::fflush(stdout);
  }
}

}  // namespace fucina::cli
