#include "kernels/cpu/streamed_memory.h"

#include <sys/mman.h>

#include <cerrno>
#include <new>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace fucina {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
// Arena chunks: large enough that the partly used 2 MiB page at each chunk's end is a small
// share of it.
constexpr size_t kArenaChunk = size_t{64} << 20;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

absl::StatusOr<StreamedBuffer> StreamedBuffer::Create(size_t bytes) {
  StreamedBuffer buf;
  if (bytes == 0) return buf;
  const size_t size = RoundUp(bytes, kHugePage);
  // Map one huge page more and trim, so that the span starts on a 2 MiB boundary: only whole,
  // aligned 2 MiB extents can be huge pages.
  const size_t mapped = size + kHugePage;
  void* p = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("cannot map ", bytes, " bytes"));
  }
  auto* const base = static_cast<uint8_t*>(p);
  uint8_t* const aligned = base + (kHugePage - reinterpret_cast<uintptr_t>(base) % kHugePage) %
                                      kHugePage;
  if (aligned > base) ::munmap(base, aligned - base);
  if (aligned + size < base + mapped) ::munmap(aligned + size, base + mapped - (aligned + size));
  // Advice only: refused (no THP support) it changes nothing, and pages stay 4 KiB.
  ::madvise(aligned, size, MADV_HUGEPAGE);
  buf.data_ = aligned;
  buf.size_ = size;
  return buf;
}

StreamedBuffer::~StreamedBuffer() {
  if (data_ != nullptr) ::munmap(data_, size_);
}

StreamedBuffer::StreamedBuffer(StreamedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

StreamedBuffer& StreamedBuffer::operator=(StreamedBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) ::munmap(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

uint8_t* StreamedArena::Allocate(size_t bytes) {
  const size_t need = RoundUp(bytes == 0 ? 1 : bytes, 64);
  if (chunks_.empty() || chunks_.back().size() - used_ < need) {
    // A request larger than a chunk gets a chunk of its own size; what the last chunk had left
    // stays unused (never touched, so never resident beyond its last partly used page).
    absl::StatusOr<StreamedBuffer> chunk =
        StreamedBuffer::Create(need > kArenaChunk ? need : kArenaChunk);
    if (!chunk.ok()) throw std::bad_alloc();
    chunks_.push_back(*std::move(chunk));
    used_ = 0;
  }
  uint8_t* const p = chunks_.back().data() + used_;
  used_ += need;
  return p;
}

}  // namespace fucina
