#include "models/tokenizer/spm.h"

#include <algorithm>
#include <map>
#include <queue>
#include <utility>

#include "absl/strings/string_view.h"
#include "models/tokenizer/unicode.h"

namespace fucina {
namespace {

struct Symbol {
  int prev;
  int next;
  size_t offset;
  size_t n;  // 0 once merged into its left neighbour.
};

struct Bigram {
  int left;
  int right;
  float score;
  size_t size;
};

// Pops the highest score first, then the leftmost.
struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

class Session {
 public:
  Session(std::string_view text, const SpmVocab& vocab) : text_(text), vocab_(vocab) {}

  void Run(std::vector<int32_t>* out) {
    for (size_t off = 0; off < text_.size();) {
      const size_t len = std::min<size_t>(text_.size() - off,
                                          Utf8SeqLen(static_cast<uint8_t>(text_[off])));
      const int index = static_cast<int>(symbols_.size());
      symbols_.push_back({index - 1, off + len == text_.size() ? -1 : index + 1, off, len});
      off += len;
    }
    for (int i = 1; i < static_cast<int>(symbols_.size()); ++i) TryAddBigram(i - 1, i);
    while (!queue_.empty()) {
      const Bigram b = queue_.top();
      queue_.pop();
      Symbol& left = symbols_[b.left];
      Symbol& right = symbols_[b.right];
      if (left.n == 0 || right.n == 0 || left.n + right.n != b.size) continue;
      left.n += right.n;
      right.n = 0;
      left.next = right.next;
      if (right.next >= 0) symbols_[right.next].prev = b.left;
      TryAddBigram(left.prev, b.left);
      TryAddBigram(b.left, left.next);
    }
    for (int i = symbols_.empty() ? -1 : 0; i != -1; i = symbols_[i].next) {
      Resegment(symbols_[i].offset, symbols_[i].n, out);
    }
  }

 private:
  int32_t Find(std::string_view s) const {
    const auto it = vocab_.token_to_id->find(absl::string_view(s.data(), s.size()));
    return it == vocab_.token_to_id->end() ? -1 : it->second;
  }

  void TryAddBigram(int left, int right) {
    if (left < 0 || right < 0) return;
    const size_t size = symbols_[left].n + symbols_[right].n;
    const std::string_view s = text_.substr(symbols_[left].offset, size);
    const int32_t id = Find(s);
    if (id < 0 || static_cast<size_t>(id) >= vocab_.scores->size()) return;
    queue_.push({left, right, (*vocab_.scores)[id], size});
    // The latest pair that formed this text: how to split a merged symbol that is not itself a
    // token (possible when a later bigram overwrote the entry; llama.cpp behaves the same).
    rev_merge_[std::string(s)] = {left, right};
  }

  void Resegment(size_t offset, size_t n, std::vector<int32_t>* out) const {
    const std::string_view s = text_.substr(offset, n);
    if (const int32_t id = Find(s); id >= 0) {
      out->push_back(id);
      return;
    }
    const auto it = rev_merge_.find(std::string(s));
    if (it == rev_merge_.end()) {
      for (char c : s) {
        const int32_t id = (*vocab_.byte_tokens)[static_cast<uint8_t>(c)];
        if (id >= 0) out->push_back(id);
      }
      return;
    }
    // Like llama.cpp, split into the two symbols' current extents. Every merged symbol is a
    // token, so this only runs for text that never merged; kept for exactness.
    const Symbol& l = symbols_[it->second.first];
    const Symbol& r = symbols_[it->second.second];
    Resegment(l.offset, l.n, out);
    Resegment(r.offset, r.n, out);
  }

  std::string_view text_;
  const SpmVocab& vocab_;
  std::vector<Symbol> symbols_;
  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue_;
  std::map<std::string, std::pair<int, int>> rev_merge_;
};

}  // namespace

void SpmEncode(std::string_view text, const SpmVocab& vocab, std::vector<int32_t>* out) {
  Session(text, vocab).Run(out);
}

}  // namespace fucina
