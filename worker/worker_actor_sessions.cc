// The worker actor's sessions (worker_actor.h): a step's segments checked against them, their
// creation, and the session operations a step carries, applied on the executor.
#include "worker/worker_actor.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"
#include "worker/sampling_wire.h"

namespace fucina {

absl::Status WorkerActor::CheckSegment(const wire::Segment& seg, int64_t* new_kv_bytes) const {
  const int64_t count = seg.token_ids_size();
  if (count == 0) return absl::InvalidArgumentError("segment has no tokens");
  auto it = sessions_.find(seg.session_id());
  const int64_t len = it == sessions_.end() ? 0 : it->second.kv->len();
  if (it == sessions_.end() && seg.pos0() != 0) {
    return absl::InvalidArgumentError(absl::StrCat("unknown session ", seg.session_id(),
                                                   " (pos0 ", seg.pos0(), ")"));
  }
  if (seg.pos0() < 0 || seg.pos0() > len) {
    return absl::InvalidArgumentError(absl::StrCat("session ", seg.session_id(), " holds ", len,
                                                   " positions; segment starts at ",
                                                   seg.pos0()));
  }
  if (seg.pos0() < len && seg.pos0() < it->second.kv->MinTruncateLength()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "session ", seg.session_id(), " cannot drop back from ", len, " to ", seg.pos0(),
        " positions (its sliding-window ring keeps ", it->second.kv->MinTruncateLength(), ")"));
  }
  if (seg.drafts() < 0 || seg.drafts() >= count) {
    return absl::InvalidArgumentError(absl::StrCat("session ", seg.session_id(), ": ",
                                                   seg.drafts(), " drafts in a segment of ",
                                                   count, " tokens"));
  }
  if (seg.drafts() > 0 && (seg.all_logits() || seg.prefill_only())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "session ", seg.session_id(), ": drafts need a sampled segment"));
  }
  if (seg.pos0() + count > shard_.context()) {
    return absl::OutOfRangeError(absl::StrCat("session ", seg.session_id(), ": ", seg.pos0(),
                                              " + ", count, " positions exceed the context of ",
                                              shard_.context()));
  }
  const int64_t vocab = model_->config().vocab_size;
  for (int32_t id : seg.token_ids()) {
    if (id < 0 || id >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("token id ", id, " outside the vocabulary [0, ",
                                                     vocab, ")"));
    }
  }
  if (model_->has_head() && seg.has_sampling()) {
    // The sampling stage receives what the coordinator validated; checked again so a bad value
    // is a segment error here rather than garbage text.
    if (auto p = SamplingFromWire(seg.sampling(), static_cast<int32_t>(vocab)); !p.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("session ", seg.session_id(), ": ",
                                                     p.status().message()));
    }
  }
  if (model_->has_head() && !seg.all_logits() && !seg.prefill_only() && !seg.has_sampling() &&
      (it == sessions_.end() || it->second.sampler == nullptr)) {
    return absl::InvalidArgumentError(absl::StrCat("session ", seg.session_id(),
                                                   " has no sampling parameters"));
  }
  if (it == sessions_.end()) {
    *new_kv_bytes += kv_bytes_per_session_;
    if (options_.memory_budget > 0 && UsedBytes() + *new_kv_bytes > options_.memory_budget) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "a new session needs ", kv_bytes_per_session_, " KV bytes; ",
          options_.memory_budget - UsedBytes(), " of the budget are free"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<WorkerActor::Session*> WorkerActor::SessionOrNew(uint64_t id) {
  auto it = sessions_.find(id);
  if (it != sessions_.end()) return &it->second;
  auto type = ParseKvCacheType(shard_.cache_type().empty() ? "f16" : shard_.cache_type());
  if (!type.ok()) return type.status();
  auto kv = model_->NewKvCache(shard_.context(), *type);
  if (!kv.ok()) return kv.status();
  Session& s = sessions_[id];
  s.kv = *std::move(kv);
  return &s;
}

absl::StatusOr<std::unique_ptr<GrammarMatcher>> WorkerActor::CompileGrammar(
    const wire::Sampling& sampling) {
  // The coordinator compiled it already under its --grammar-timeout; the limit here only
  // guards the executor against a grammar no coordinator checked.
  constexpr std::chrono::milliseconds kLimit{10'000};
  absl::StatusOr<GrammarSpec> spec = GrammarFromWire(sampling);
  if (!spec.ok()) return spec.status();
  if (grammar_vocab_ == nullptr) {
    auto tokenizer = Tokenizer::FromGguf(model_->file());
    if (!tokenizer.ok()) return tokenizer.status();
    auto vocab = GrammarVocab::Create(**tokenizer);
    if (!vocab.ok()) return vocab.status();
    grammar_vocab_ = *std::move(vocab);
  }
  return grammar_vocab_->Compile(*spec, kLimit);
}

absl::Status WorkerActor::ApplySessionOp(const wire::SessionOp& op) {
  switch (op.kind_case()) {
    case wire::SessionOp::kTruncate: {
      const wire::TruncateSession& t = op.truncate();
      auto it = sessions_.find(t.session_id());
      if (it == sessions_.end()) {
        return absl::InvalidArgumentError(absl::StrCat("truncate: unknown session ", t.session_id()));
      }
      Session& s = it->second;
      if (absl::Status st = s.kv->Truncate(t.length()); !st.ok()) {
        return absl::Status(st.code(), absl::StrCat("truncate: session ", t.session_id(), ": ",
                                                    st.message()));
      }
      s.history.resize(std::min<size_t>(s.history.size(), s.kv->len()));
      return absl::OkStatus();
    }
    case wire::SessionOp::kCopyPrefix:
      return ApplyCopyPrefix(op.copy_prefix());
    case wire::SessionOp::kRelease:
      sessions_.erase(op.release().session_id());  // idempotent: a retried release is no error
      return absl::OkStatus();
    case wire::SessionOp::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "a session operation of a kind this worker does not know (a newer coordinator?)");
}

absl::Status WorkerActor::ApplyCopyPrefix(const wire::CopyPrefix& copy) {
  auto from = sessions_.find(copy.from_session());
  if (from == sessions_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("copy: unknown session ", copy.from_session()));
  }
  if (copy.from_session() == copy.to_session()) {
    return absl::InvalidArgumentError("copy: from a session to itself");
  }
  if (copy.length() < 0 || copy.length() > from->second.kv->len()) {
    return absl::InvalidArgumentError(absl::StrCat("copy: session ", copy.from_session(),
                                                   " holds ", from->second.kv->len(),
                                                   " positions; cannot copy ", copy.length()));
  }
  if (!sessions_.contains(copy.to_session()) && options_.memory_budget > 0 &&
      UsedBytes() + kv_bytes_per_session_ > options_.memory_budget) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "copy: a new session needs ", kv_bytes_per_session_, " KV bytes; ",
        options_.memory_budget - UsedBytes(), " of the budget are free"));
  }
  auto to = SessionOrNew(copy.to_session());
  if (!to.ok()) return to.status();
  from = sessions_.find(copy.from_session());  // SessionOrNew may rehash
  if (absl::Status s = (*to)->kv->CopyPrefixFrom(*from->second.kv, copy.length()); !s.ok()) {
    return s;
  }
  (*to)->history.assign(from->second.history.begin(),
                        from->second.history.begin() + copy.length());
  (*to)->sampler.reset();
  (*to)->grammar.reset();
  return absl::OkStatus();
}

}  // namespace fucina
