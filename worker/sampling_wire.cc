#include "worker/sampling_wire.h"

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

}  // namespace fucina
