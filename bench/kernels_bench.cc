// `fucina bench kernels`: matvec / matmul throughput per weight type against the machine's
// read bandwidth, measured in the same run.
//
// A decode step reads every weight once, so a matvec's ceiling is the memory read bandwidth.
// The weights are a stack of decode-shaped matrices whose total exceeds the last-level cache,
// cycled so every call streams from DRAM; the bound is a plain read of an equally large
// buffer on 1 thread and on all threads. A lockstep step (8 activation rows) runs over the
// same stack. A prefill-shaped matmul is compute-bound: its bound is one core's measured issue
// rate of the tiles' core instruction (FMA; vpdpbusd, or AVX2's vpmaddubsw + vpmaddwd step)
// times the threads (%pk). Decode attention after a long context is measured against its own
// bounds (bench/attention_bench.h).
#include "kernels/cpu/avx512/undefined_vectors.h"  // before any intrinsics: GCC bug 105593

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <immintrin.h>

#include <CLI/CLI.hpp>

#include "absl/strings/str_split.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/streamed_memory.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/ggml_type.h"
#include "kernels/matmul.h"
#include "kernels/tile_layout.h"
#include "kernels/type_traits.h"
#include "bench/attention_bench.h"
#include "bench/best_rate.h"
#include "bench/stream_bounds.h"
#include "tools/commands.h"

namespace fucina::cli {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct BenchArgs {
  int64_t working_set_mib = 1024;
  int64_t rows = 4096;
  int64_t cols = 4096;
  int64_t batch = 128;
  int64_t prefill_batch = 512;
  int threads = 0;
  double min_seconds = 1.0;
  int64_t kv_context = 4000;
  std::string types = "f32,f16,bf16,q8_0,q4_0,q4_1,q5_0,q5_1,q4_k,q5_k,q6_k";
};

// Peak issue rate of one core for the tiles' core instructions: 12 independent chains (enough
// to cover the latency on two ports) of 512-bit FMAs (f32: 32 flops each) or vpdpbusd (int8:
// 128 ops each), registers pinned by an empty asm so nothing is folded or spilled. The bound
// that a compute-bound kernel's GFLOP/s are measured against. AVX2 has no vpdpbusd: its int8
// step is vpmaddubsw, vpmaddwd and vpaddd for 32 products (64 ops), what the Q8_0 and legacy
// tiles pay per activation dword and column (Q4_K's sub-blocks take one vpmaddwd per eight
// vpmaddubsw, so they can pass it).
#define FUCINA_PEAK_REGS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define FUCINA_PEAK_PIN(i) , "+v"(a##i)
constexpr int64_t kPeakIters = 1 << 20;

// double Name(): GOP/s of kOps a step; INIT(i) declares chain a##i, SETUP its constants and
// STEP(i) advances it.
#define FUCINA_PEAK_FN(Name, kTarget, INIT, SETUP, STEP, kOps)                \
  __attribute__((target(kTarget))) double Name() {                          \
    FUCINA_PEAK_REGS(INIT)                                                   \
    SETUP                                                                    \
    const Clock::time_point t0 = Clock::now();                               \
    for (int64_t i = 0; i < kPeakIters; ++i) {                               \
      FUCINA_PEAK_REGS(STEP)                                                 \
      asm volatile("" : "+v"(a0) FUCINA_PEAK_REGS(FUCINA_PEAK_PIN));         \
    }                                                                        \
    return kPeakIters * 12.0 * (kOps) / Seconds(t0, Clock::now()) / 1e9;     \
  }

#define FUCINA_INIT_PS512(i) __m512 a##i = _mm512_set1_ps(1.0f + i);
#define FUCINA_INIT_EPI512(i) __m512i a##i = _mm512_set1_epi32(i);
#define FUCINA_INIT_PS256(i) __m256 a##i = _mm256_set1_ps(1.0f + i);
#define FUCINA_INIT_EPI256(i) __m256i a##i = _mm256_set1_epi32(i);
#define FUCINA_FMA512(i) a##i = _mm512_fmadd_ps(a##i, m, c);
#define FUCINA_DPBUSD(i) a##i = _mm512_dpbusd_epi32(a##i, u, v);
#define FUCINA_FMA256(i) a##i = _mm256_fmadd_ps(a##i, m, c);
// Each chain feeds its own products (the values do not matter, only that nothing is
// loop-invariant).
#define FUCINA_INT8_STEP256(i) \
  a##i = _mm256_add_epi32(a##i, _mm256_madd_epi16(_mm256_maddubs_epi16(a##i, v), ones));

FUCINA_PEAK_FN(FmaGflopsAvx512, "avx512f", FUCINA_INIT_PS512,
               const __m512 m = _mm512_set1_ps(0.999999f);
               const __m512 c = _mm512_set1_ps(1e-6f);, FUCINA_FMA512, 32)
FUCINA_PEAK_FN(VnniGopsAvx512, "avx512f,avx512vnni", FUCINA_INIT_EPI512,
               const __m512i u = _mm512_set1_epi8(3);
               const __m512i v = _mm512_set1_epi8(-2);, FUCINA_DPBUSD, 128)
FUCINA_PEAK_FN(FmaGflopsAvx2, "avx2,fma", FUCINA_INIT_PS256,
               const __m256 m = _mm256_set1_ps(0.999999f);
               const __m256 c = _mm256_set1_ps(1e-6f);, FUCINA_FMA256, 16)
FUCINA_PEAK_FN(Int8PairGopsAvx2, "avx2", FUCINA_INIT_EPI256,
               const __m256i v = _mm256_set1_epi8(-2);
               const __m256i ones = _mm256_set1_epi16(1);, FUCINA_INT8_STEP256, 64)

#undef FUCINA_INT8_STEP256
#undef FUCINA_FMA256
#undef FUCINA_DPBUSD
#undef FUCINA_FMA512
#undef FUCINA_INIT_EPI256
#undef FUCINA_INIT_PS256
#undef FUCINA_INIT_EPI512
#undef FUCINA_INIT_PS512
#undef FUCINA_PEAK_FN
#undef FUCINA_PEAK_PIN
#undef FUCINA_PEAK_REGS

struct ComputePeak {
  double fma_gflops = 0;  // one core; 0 where the ISA has no measurement here.
  double int8_gops = 0;
};

// Best of a few runs: the first warms the core's wide units up to their clock. (The avx512
// level includes VNNI, kernels/cpu/isa.cc.)
ComputePeak MeasureComputePeak() {
  ComputePeak p;
  if (ActiveIsa() < Isa::kAvx2) return p;
  const bool avx512 = ActiveIsa() >= Isa::kAvx512;
  for (int i = 0; i < 5; ++i) {
    p.fma_gflops = std::max(p.fma_gflops, avx512 ? FmaGflopsAvx512() : FmaGflopsAvx2());
    p.int8_gops = std::max(p.int8_gops, avx512 ? VnniGopsAvx512() : Int8PairGopsAvx2());
  }
  return p;
}

// Best-of-repeats read bandwidth in GB/s over `buf` with `pool`'s threads, the faster of the
// read with and without software prefetch (bench/stream_bounds.h).
double ReadBandwidth(const uint64_t* buf, int64_t n, ThreadPool& pool, double min_seconds) {
  std::vector<uint64_t> sinks(pool.num_threads() * 8);
  double best = 0;
  for (const bool prefetch : {false, true}) {
    best = std::max(best, BestRate(n * 8.0 / 1e9, min_seconds, [&] {
      pool.Run([&](int thread) {
        const int64_t per = (n / pool.num_threads()) & ~int64_t{31};
        const int64_t b = thread * per;
        const int64_t e = thread == pool.num_threads() - 1 ? n : b + per;
        // The sink keeps the loads alive.
        sinks[thread * 8] = ReadRange(buf + b, e - b, prefetch);
      });
    }));
  }
  return best;
}

struct TypeResult {
  double gbps = 0;    // weight bytes read per second
  double gflops = 0;  // 2 * m * rows * cols per call
};

// m activation rows (x: m rows of cols floats) against the cycled stack of matrices, so every
// call streams its weights from memory: a matvec (m = 1) or a lockstep batch's step (m = 8).
// Best of repeated full passes.
TypeResult StreamedThroughput(const std::vector<WeightView>& mats, const std::vector<float>& x,
                              int64_t m, std::vector<float>& y, ThreadPool& pool,
                              double min_seconds) {
  uint64_t bytes = 0;
  for (const WeightView& w : mats) bytes += w.row_stride * w.rows;
  const double best = BestRate(static_cast<double>(bytes), min_seconds, [&] {
    for (const WeightView& w : mats) MatMul(w, x.data(), m, y.data(), pool);
  });
  const WeightView& w0 = mats.front();
  const double per_matrix_bytes = static_cast<double>(w0.row_stride * w0.rows);
  return {best / 1e9, best / per_matrix_bytes * 2.0 * m * w0.rows * w0.cols / 1e9};
}

double MatMulGflops(const WeightView& w, int64_t m, ThreadPool& pool, double min_seconds) {
  std::vector<float> x(m * w.cols), y(m * w.rows);
  std::mt19937 rng(1);
  std::normal_distribution<float> nd;
  for (float& v : x) v = nd(rng);
  return BestRate(2.0 * m * w.rows * w.cols / 1e9, min_seconds,
                  [&] { MatMul(w, x.data(), m, y.data(), pool); });
}

int RunKernels(const BenchArgs& args) {
  const int all_threads = args.threads > 0 ? args.threads : ThreadPool::Default().num_threads();
  ThreadPool one(1);
  ThreadPool all(all_threads);
  const size_t ws_bytes = static_cast<size_t>(args.working_set_mib) << 20;

  std::printf("isa: %s (detected %s)  threads: %d  working set: %lld MiB  matvec %lld x %lld"
              "  matmul batch %lld and %lld\n",
              std::string(IsaName(ActiveIsa())).c_str(), std::string(IsaName(DetectedIsa())).c_str(),
              all_threads, static_cast<long long>(args.working_set_mib),
              static_cast<long long>(args.rows), static_cast<long long>(args.cols),
              static_cast<long long>(args.batch), static_cast<long long>(args.prefill_batch));
  double bw1, bwn;
  {
    // The same kind of memory as the weights below and the engine's (huge pages): the bound
    // must not pay TLB misses the kernels do not.
    absl::StatusOr<StreamedBuffer> mem = StreamedBuffer::Create(ws_bytes);
    if (!mem.ok()) {
      std::fprintf(stderr, "working set: %s\n", std::string(mem.status().message()).c_str());
      return 1;
    }
    auto* const buf = reinterpret_cast<uint64_t*>(mem->data());
    const int64_t n = static_cast<int64_t>(ws_bytes / 8);
    for (int64_t i = 0; i < n; ++i) buf[i] = i * 0x9E3779B97F4A7C15ull;
    bw1 = ReadBandwidth(buf, n, one, args.min_seconds);
    bwn = ReadBandwidth(buf, n, all, args.min_seconds);
  }
  std::printf("read bandwidth: %.2f GB/s (1 thread), %.2f GB/s (%d threads)\n", bw1, bwn,
              all_threads);
  const ComputePeak peak = MeasureComputePeak();
  if (peak.fma_gflops > 0) {
    const char* int8 = ActiveIsa() >= Isa::kAvx512 ? "vpdpbusd" : "vpmaddubsw+vpmaddwd";
    std::printf("compute peak of one core: f32 FMA %.1f GFLOP/s, int8 %s %.1f GOP/s (%%pk: mmP "
                "against %d cores of it, %%pk1: ls1 against one; float types against FMA, "
                "quantized against the int8 step)\n",
                peak.fma_gflops, int8, peak.int8_gops, all_threads);
  }
  std::printf("\n%-8s | %9s %6s %8s | %9s %6s %8s | %7s %5s %7s | %12s %12s %5s\n", "type",
              "mv1 GB/s", "%bw1", "GFLOP/s", "mvN GB/s", "%bwN", "GFLOP/s", "ls1", "%pk1", "lsN",
              "mm GFLOP/s", "mmP GFLOP/s", "%pk");

  std::mt19937 rng(42);
  std::normal_distribution<float> nd;
  std::vector<float> src(args.rows * args.cols);
  for (float& v : src) v = nd(rng) * 0.02f;
  // Activation rows of a lockstep step (ls columns): the widest decode-shaped call.
  constexpr int64_t kLockstep = 8;
  std::vector<float> x(kLockstep * args.cols), y(kLockstep * args.rows);
  for (float& v : x) v = nd(rng);

  for (const std::string& name : std::vector<std::string>(absl::StrSplit(args.types, ','))) {
    const std::optional<GgmlType> type = ParseGgmlType(name);
    if (!type || !HasMatVec(*type) || args.cols % TypeInfo(*type).block_size != 0) {
      std::printf("%-6s | skipped (no matvec kernel or cols not a multiple of the block)\n",
                  name.c_str());
      continue;
    }
    const size_t row_bytes = static_cast<size_t>(RowBytes(*type, args.cols));
    const size_t mat_bytes = row_bytes * args.rows;
    // One matrix quantized once, then copied to fill a working set larger than the caches.
    const size_t count = std::max<size_t>(2, (ws_bytes + mat_bytes - 1) / mat_bytes);
    // Huge pages, as the engine's own weight copies (kernels/cpu/streamed_memory.h).
    absl::StatusOr<StreamedBuffer> buffer = StreamedBuffer::Create(mat_bytes * count);
    if (!buffer.ok()) {
      std::fprintf(stderr, "%s weights: %s\n", name.c_str(),
                   std::string(buffer.status().message()).c_str());
      return 1;
    }
    uint8_t* const base = buffer->data();
    const CpuTypeTraits* traits = GetCpuTraits(*type);
    for (int64_t r = 0; r < args.rows; ++r) {
      traits->from_float(src.data() + r * args.cols, base + r * row_bytes, args.cols);
    }
    for (size_t i = 1; i < count; ++i) {
      std::memcpy(base + i * mat_bytes, base, mat_bytes);
    }
    std::vector<WeightView> mats;
    for (size_t i = 0; i < count; ++i) {
      mats.push_back(WeightView::Dense(base + i * mat_bytes, *type, args.rows, args.cols));
    }
    const bool is_float = *type == GgmlType::kF32 || *type == GgmlType::kF16 ||
                          *type == GgmlType::kBF16;
    const double core_peak = is_float ? peak.fma_gflops : peak.int8_gops;
    const double bound = all_threads * core_peak;
    auto measure = [&](const std::string& label) {
      const TypeResult r1 = StreamedThroughput(mats, x, 1, y, one, args.min_seconds);
      const TypeResult rn = StreamedThroughput(mats, x, 1, y, all, args.min_seconds);
      const TypeResult l1 = StreamedThroughput(mats, x, kLockstep, y, one, args.min_seconds);
      const TypeResult ln = StreamedThroughput(mats, x, kLockstep, y, all, args.min_seconds);
      const double mm = MatMulGflops(mats.front(), args.batch, all, args.min_seconds);
      // Prefill-shaped: a whole prompt of activation rows against the same matrix.
      const double mmp = MatMulGflops(mats.front(), args.prefill_batch, all, args.min_seconds);
      std::printf("%-8s | %9.2f %5.0f%% %8.2f | %9.2f %5.0f%% %8.2f | %7.1f %4.0f%% %7.1f | "
                  "%12.1f %12.1f %4.0f%%\n",
                  label.c_str(), r1.gbps, 100 * r1.gbps / bw1, r1.gflops, rn.gbps,
                  100 * rn.gbps / bwn, rn.gflops, l1.gflops,
                  core_peak > 0 ? 100 * l1.gflops / core_peak : 0.0, ln.gflops, mm, mmp,
                  bound > 0 ? 100 * mmp / bound : 0.0);
      std::fflush(stdout);
    };
    measure(name);
    if (TileLayoutApplies(mats.front())) {
      // The layout the engine loads these weights in (kernels/tile_layout.h), in place.
      PackTiles16(mats.front(), 0, args.rows / kTileRows, base);
      for (size_t i = 0; i < count; ++i) {
        if (i > 0) std::memcpy(base + i * mat_bytes, base, mat_bytes);
        mats[i].layout = WeightLayout::kTiles16;
      }
      measure(name + "/t16");
    }
  }
  if (args.kv_context > 0) {
    DecodeAttentionShape shape;
    shape.context = args.kv_context;
    ReportDecodeAttention(shape, static_cast<int64_t>(ws_bytes), one, all, args.min_seconds);
  }
  return 0;
}

}  // namespace

void RegisterBenchCommands(CLI::App& app, int* exit_code) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);
  auto args = std::make_shared<BenchArgs>();
  CLI::App* kernels = bench->add_subcommand(
      "kernels", "Matvec/matmul GB/s and GFLOP/s per weight type vs measured read bandwidth");
  kernels->add_option("--working-set-mib", args->working_set_mib,
                      "Weights cycled per pass (larger than the last-level cache)")
      ->capture_default_str();
  kernels->add_option("--rows", args->rows)->capture_default_str();
  kernels->add_option("--cols", args->cols)->capture_default_str();
  kernels->add_option("--batch", args->batch, "Activation rows for the matmul column")
      ->capture_default_str();
  kernels->add_option("--prefill-batch", args->prefill_batch,
                      "Activation rows for the prefill-shaped matmul column (mmP)")
      ->capture_default_str();
  kernels->add_option("--threads", args->threads, "Threads for the N-thread columns (default: all)");
  kernels->add_option("--min-seconds", args->min_seconds, "Time per measurement")
      ->capture_default_str();
  kernels->add_option("--types", args->types, "Comma-separated weight types")->capture_default_str();
  kernels->add_option("--kv-context", args->kv_context,
                      "Positions for the decode attention section (0: skip it)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{65536}));
  kernels->callback([args, exit_code] { *exit_code = RunKernels(*args); });
  RegisterClusterBench(*bench, exit_code);
  RegisterClusterAggregateBench(*bench, exit_code);
  RegisterEsBench(*bench, exit_code);
  RegisterSpecBench(*bench, exit_code);
  RegisterGrammarBench(*bench, exit_code);
}

}  // namespace fucina::cli
