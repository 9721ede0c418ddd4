#include "models/speculative/suffix_automaton.h"

namespace fucina {

SuffixAutomaton::SuffixAutomaton() {
  states_.push_back({});
  out_.emplace_back();
}

void SuffixAutomaton::Append(int32_t token) {
  const int64_t end = static_cast<int64_t>(text_.size());
  text_.push_back(token);
  const int32_t cur = static_cast<int32_t>(states_.size());
  states_.push_back({states_[last_].length + 1, -1, end});
  out_.emplace_back();
  int32_t p = last_;
  while (p != -1 && Next(p, token) == -1) {
    next_[Key(p, token)] = cur;
    out_[p].push_back(token);
    p = states_[p].link;
  }
  if (p == -1) {
    states_[cur].link = 0;
  } else {
    const int32_t q = Next(p, token);
    if (states_[p].length + 1 == states_[q].length) {
      states_[cur].link = q;
    } else {
      // Split q: the clone holds the strings of q up to length(p) + 1, which now also end here.
      const int32_t clone = static_cast<int32_t>(states_.size());
      states_.push_back({states_[p].length + 1, states_[q].link, states_[q].first_end});
      std::vector<int32_t> tokens = out_[q];  // out_ may reallocate below
      out_.push_back(std::move(tokens));
      for (int32_t t : out_[clone]) next_[Key(clone, t)] = Next(q, t);
      while (p != -1 && Next(p, token) == q) {
        next_[Key(p, token)] = clone;
        p = states_[p].link;
      }
      states_[q].link = clone;
      states_[cur].link = clone;
    }
  }
  last_ = cur;
}

SuffixAutomaton::Match SuffixAutomaton::Step(Match match, int32_t token) const {
  int32_t s = match.state;
  int64_t length = match.length;
  while (s != -1) {
    const int32_t to = Next(s, token);
    if (to != -1) return {to, length + 1};
    s = states_[s].link;
    if (s != -1) length = states_[s].length;
  }
  return {0, 0};
}

SuffixAutomaton::Match SuffixAutomaton::Normalize(Match match) const {
  while (match.state != 0 && states_[states_[match.state].link].length >= match.length) {
    match.state = states_[match.state].link;
  }
  return match;
}

int64_t SuffixAutomaton::FirstEnd(const Match& match) const {
  return match.length == 0 ? -1 : states_[match.state].first_end;
}

}  // namespace fucina
