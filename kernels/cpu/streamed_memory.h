// Memory that decode reads whole every token: the weights the engine owns (fused and tile-
// repacked matrices) and the KV cache. Anonymous mappings advised to transparent huge pages.
//
// Why: a decode step streams every weight byte once, in order. On 4 KiB pages that is a TLB
// miss every 4 KiB (a 640 MB Q8_0 model: ~156,000 page walks per token) that the hardware
// prefetchers cannot run ahead of; on 2 MiB pages there are 320. Qwen3-0.6B-shape Q8_0 decode
// (tile-repacked weights, all in this memory) on a Zen 5 VM, alternated runs: 1 thread +7% to
// +21% in each of 5 pairs; 2 threads -5% to +15%, +8% in the median of 5.
// Where the kernel gives no huge pages (THP "never", fragmented memory) the mapping is still
// correct: it falls back to 4 KiB pages.
#ifndef FUCINA_KERNELS_CPU_STREAMED_MEMORY_H_
#define FUCINA_KERNELS_CPU_STREAMED_MEMORY_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace fucina {

// One zero-filled anonymous mapping of at least `bytes`, 2 MiB aligned. Move-only; unmaps on
// destruction.
class StreamedBuffer {
 public:
  StreamedBuffer() = default;
  // ResourceExhausted naming the size when the mapping fails. Zero bytes: an empty buffer.
  static absl::StatusOr<StreamedBuffer> Create(size_t bytes);
  ~StreamedBuffer();
  StreamedBuffer(StreamedBuffer&& other) noexcept;
  StreamedBuffer& operator=(StreamedBuffer&& other) noexcept;
  StreamedBuffer(const StreamedBuffer&) = delete;
  StreamedBuffer& operator=(const StreamedBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;  // mapped bytes: the request rounded up to 2 MiB
};

// Many buffers of one lifetime packed into few StreamedBuffers, so that small matrices (a
// 576-wide model's are ~200 KiB) share huge pages instead of each rounding up to 2 MiB.
class StreamedArena {
 public:
  // A zero-filled, 64-byte aligned (tile kernels load whole cache lines) span of `bytes`,
  // valid until the arena is destroyed. Throws std::bad_alloc when a mapping fails, as `new`
  // would (its callers bind tensors and have no status to return).
  uint8_t* Allocate(size_t bytes);

 private:
  std::vector<StreamedBuffer> chunks_;
  size_t used_ = 0;  // bytes handed out from chunks_.back()
};

}  // namespace fucina

#endif  // FUCINA_KERNELS_CPU_STREAMED_MEMORY_H_
