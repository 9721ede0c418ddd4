#include "worker/sampling_wire.h"

#include "absl/strings/str_cat.h"

namespace fucina {

wire::Sampling SamplingToWire(const SamplingParams& p) {
  wire::Sampling s;
  s.set_temperature(p.temperature);
  s.set_top_k(p.top_k);
  s.set_top_p(p.top_p);
  s.set_min_p(p.min_p);
  s.set_repetition_penalty(p.repetition_penalty);
  s.set_presence_penalty(p.presence_penalty);
  s.set_frequency_penalty(p.frequency_penalty);
  s.set_penalty_last_n(p.penalty_last_n);
  s.set_seed(p.seed);
  s.set_top_logprobs(p.top_logprobs);
  for (const LogitBias& b : p.logit_bias) {
    wire::TokenBias* t = s.add_logit_bias();
    t->set_id(b.id);
    t->set_bias(b.bias);
  }
  return s;
}

absl::StatusOr<SamplingParams> SamplingFromWire(const wire::Sampling& s, int32_t vocab_size) {
  SamplingParams p;
  p.temperature = s.temperature();
  p.top_k = s.top_k();
  p.top_p = s.top_p();
  p.min_p = s.min_p();
  p.repetition_penalty = s.repetition_penalty();
  p.presence_penalty = s.presence_penalty();
  p.frequency_penalty = s.frequency_penalty();
  p.penalty_last_n = s.penalty_last_n();
  p.seed = s.seed();
  p.top_logprobs = s.top_logprobs();
  p.logit_bias.reserve(s.logit_bias_size());
  for (const wire::TokenBias& b : s.logit_bias()) p.logit_bias.push_back({b.id(), b.bias()});
  if (absl::Status st = ValidateSamplingParams(p, vocab_size); !st.ok()) return st;
  return p;
}

void GrammarToWire(const GrammarSpec& grammar, wire::Sampling* sampling) {
  if (grammar.empty()) return;
  sampling->set_grammar_kind(GrammarKindName(grammar.kind));
  sampling->set_grammar(grammar.text);
}

absl::StatusOr<GrammarSpec> GrammarFromWire(const wire::Sampling& sampling) {
  if (sampling.grammar_kind().empty()) return GrammarSpec();
  const std::optional<GrammarSpec::Kind> kind = GrammarKindFromName(sampling.grammar_kind());
  if (!kind.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown grammar kind '", sampling.grammar_kind(), "'"));
  }
  if (sampling.grammar().size() > kMaxWireGrammarBytes) {
    return absl::InvalidArgumentError(absl::StrCat("a grammar of ", sampling.grammar().size(),
                                                   " bytes (at most ", kMaxWireGrammarBytes,
                                                   ")"));
  }
  return GrammarSpec{*kind, sampling.grammar()};
}

void VerifiedToWire(const Verified& verified, wire::SegmentResult* result) {
  result->set_grammar_done(verified.stopped);
  for (int i = 0; i <= verified.accepted; ++i) {
    const SampleResult& sample = verified.samples[i];
    wire::TokenSample* out = nullptr;
    if (i < verified.accepted) out = result->add_accepted();
    auto* tops = out != nullptr ? out->mutable_top() : result->mutable_top();
    if (out != nullptr) {
      out->set_id(sample.id);
      out->set_logprob(sample.logprob);
    } else {
      result->set_token(sample.id);
      result->set_logprob(sample.logprob);
    }
    for (const TokenLogprob& t : sample.top) {
      wire::TokenLogprob* top = tops->Add();
      top->set_id(t.id);
      top->set_logprob(t.logprob);
    }
  }
}

}  // namespace fucina
