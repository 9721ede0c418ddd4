#include "kernels/cpu/streamed_memory.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "absl/status/statusor.h"

namespace fucina {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

// The VmFlags line of the /proc/self/smaps entry that holds `p` ("" when not found).
std::string VmFlagsOf(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &lo, &hi) == 2) {
      inside = addr >= lo && addr < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

TEST(StreamedMemoryTest, BufferIsZeroedAlignedAndRoundedToHugePages) {
  absl::StatusOr<StreamedBuffer> buf = StreamedBuffer::Create(3 * kHugePage + 100);
  ASSERT_TRUE(buf.ok()) << buf.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(buf->data()) % kHugePage, 0u);
  EXPECT_EQ(buf->size(), 4 * kHugePage);
  EXPECT_TRUE(std::all_of(buf->data(), buf->data() + buf->size(), [](uint8_t b) { return b == 0; }));
  // Writable to its last byte.
  buf->data()[buf->size() - 1] = 7;
  EXPECT_EQ(buf->data()[buf->size() - 1], 7);
}

TEST(StreamedMemoryTest, BufferIsAdvisedToHugePages) {
  absl::StatusOr<StreamedBuffer> buf = StreamedBuffer::Create(kHugePage);
  ASSERT_TRUE(buf.ok()) << buf.status();
  const std::string flags = VmFlagsOf(buf->data());
  if (flags.empty()) GTEST_SKIP() << "no /proc/self/smaps VmFlags here";
  // "hg": MADV_HUGEPAGE took. A kernel without THP refuses the advice; then there is no flag.
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  if (!thp) GTEST_SKIP() << "kernel without transparent huge pages";
  EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;
}

TEST(StreamedMemoryTest, EmptyBufferMapsNothing) {
  absl::StatusOr<StreamedBuffer> buf = StreamedBuffer::Create(0);
  ASSERT_TRUE(buf.ok());
  EXPECT_EQ(buf->data(), nullptr);
  EXPECT_EQ(buf->size(), 0u);
}

TEST(StreamedMemoryTest, AbsurdSizeIsAnErrorNamingIt) {
  absl::StatusOr<StreamedBuffer> buf = StreamedBuffer::Create(size_t{1} << 62);
  ASSERT_FALSE(buf.ok());
  EXPECT_EQ(buf.status().code(), absl::StatusCode::kResourceExhausted) << buf.status();
  EXPECT_NE(buf.status().message().find(std::to_string(size_t{1} << 62)), std::string::npos)
      << buf.status();
}

TEST(StreamedMemoryTest, MoveHandsTheMappingOver) {
  absl::StatusOr<StreamedBuffer> made = StreamedBuffer::Create(100);
  ASSERT_TRUE(made.ok());
  StreamedBuffer a = *std::move(made);
  uint8_t* const p = a.data();
  p[0] = 42;
  StreamedBuffer b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.data()[0], 42);
  b = StreamedBuffer();
  EXPECT_EQ(b.data(), nullptr);
}

TEST(StreamedMemoryTest, ArenaSpansAreAlignedDisjointAndKeepTheirBytes) {
  StreamedArena arena;
  // Small spans share chunks; the 100 MiB one (larger than a chunk) gets its own.
  const std::vector<size_t> sizes = {1, 63, 64, 65, 200 << 10, size_t{100} << 20, 3, 5 << 20};
  std::vector<std::pair<uint8_t*, size_t>> spans;
  for (size_t i = 0; i < sizes.size(); ++i) {
    uint8_t* p = arena.Allocate(sizes[i]);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << "span " << i;
    EXPECT_TRUE(std::all_of(p, p + sizes[i], [](uint8_t b) { return b == 0; })) << "span " << i;
    std::fill(p, p + sizes[i], static_cast<uint8_t>(i + 1));
    spans.emplace_back(p, sizes[i]);
  }
  for (size_t i = 0; i < spans.size(); ++i) {
    const auto [p, n] = spans[i];
    EXPECT_TRUE(std::all_of(p, p + n, [&](uint8_t b) { return b == i + 1; })) << "span " << i;
    for (size_t j = i + 1; j < spans.size(); ++j) {
      const auto [q, m] = spans[j];
      EXPECT_TRUE(p + n <= q || q + m <= p) << "spans " << i << " and " << j << " overlap";
    }
  }
}

TEST(StreamedMemoryTest, MovedArenaKeepsItsSpans) {
  StreamedArena arena;
  uint8_t* p = arena.Allocate(1000);
  p[999] = 9;
  StreamedArena moved = std::move(arena);
  EXPECT_EQ(p[999], 9);
  uint8_t* q = moved.Allocate(10);
  EXPECT_TRUE(q >= p + 1000 || q + 10 <= p);
}

}  // namespace
}  // namespace fucina
