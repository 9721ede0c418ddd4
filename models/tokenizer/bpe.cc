#include "models/tokenizer/bpe.h"

#include <algorithm>
#include <queue>

#include "absl/strings/string_view.h"
#include "models/tokenizer/unicode.h"

namespace fucina {

void BpeMerges::Add(std::string_view line, int32_t rank) {
  std::string key;
  const size_t space = line.size() > 1 ? line.find(' ', 1) : std::string_view::npos;
  if (space != std::string_view::npos) key = std::string(line);  // Already "left right".
  else key = " ";                                                  // ("", "").
  ranks_.try_emplace(std::move(key), rank);
}

int32_t BpeMerges::Rank(std::string_view left, std::string_view right) const {
  if (left.empty() || right.empty()) return -1;
  if (left.size() > 1 && left.find(' ', 1) != std::string_view::npos) return -1;
  std::string key;
  key.reserve(left.size() + 1 + right.size());
  key.append(left).push_back(' ');
  key.append(right);
  const auto it = ranks_.find(absl::string_view(key.data(), key.size()));
  return it == ranks_.end() ? -1 : it->second;
}

namespace {

struct Symbol {
  int prev;
  int next;
  size_t offset;  // Into the word.
  size_t n;       // Bytes; 0 once merged into its left neighbour.
};

struct Bigram {
  int left;
  int right;
  int32_t rank;
  size_t size;  // Bytes of the merged text when queued: a stale entry has a different size.
};

// std::priority_queue pops the largest: lowest rank first, then leftmost.
struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

}  // namespace

void BpeMergeWord(std::string_view word, const BpeMerges& merges,
                  std::vector<std::string_view>* pieces) {
  std::vector<Symbol> symbols;
  for (size_t off = 0; off < word.size();) {
    const size_t len = std::min<size_t>(word.size() - off,
                                        Utf8SeqLen(static_cast<uint8_t>(word[off])));
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({index - 1, off + len == word.size() ? -1 : index + 1, off, len});
    off += len;
  }
  auto text = [&](const Symbol& s) { return word.substr(s.offset, s.n); };

  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
  auto add_bigram = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const int32_t rank = merges.Rank(text(symbols[left]), text(symbols[right]));
    if (rank < 0) return;
    queue.push({left, right, rank, symbols[left].n + symbols[right].n});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) add_bigram(i - 1, i);

  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& left = symbols[b.left];
    Symbol& right = symbols[b.right];
    // Outdated: one side was merged away or grew. Symbols only grow to the right over
    // contiguous bytes, so equal size here means the same text llama.cpp compares.
    if (left.n == 0 || right.n == 0 || left.next != b.right || left.n + right.n != b.size) {
      continue;
    }
    left.n += right.n;
    right.n = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = b.left;
    add_bigram(left.prev, b.left);
    add_bigram(b.left, left.next);
  }

  for (int i = symbols.empty() ? -1 : 0; i != -1; i = symbols[i].next) {
    if (symbols[i].n > 0) pieces->push_back(text(symbols[i]));
  }
}

}  // namespace fucina
