#include "coordinator/request_output.h"

#include <algorithm>
#include <utility>

namespace fucina {

RequestOutput::RequestOutput(std::shared_ptr<Request> request, const Tokenizer& tokenizer,
                             int64_t context, int64_t cached, Metrics* metrics)
    : request_(std::move(request)),
      text_(tokenizer, request_->job(),
            std::min<int64_t>(request_->job().max_tokens,
                              context - static_cast<int64_t>(request_->job().prompt.size()))),
      cached_(cached),
      metrics_(metrics) {
  if (metrics_) {
    metrics_->OnPrefixQuery(static_cast<int64_t>(request_->job().prompt.size()), cached_);
  }
}

bool RequestOutput::Deliver(const wire::SegmentResult& result) {
  const double now = SteadySeconds();
  if (metrics_) {
    if (text_.tokens() == 0) {
      metrics_->ObserveTtft(now - request_->submitted_at());
    } else {
      metrics_->ObserveItl(now - last_token_at_);
    }
    metrics_->OnGenerated(1);
  }
  last_token_at_ = now;
  Delta delta;
  SampleResult sample;
  sample.id = result.token();
  sample.logprob = result.logprob();
  for (const wire::TokenLogprob& t : result.top()) sample.top.push_back({t.id(), t.logprob()});
  delta.ids.push_back(result.token());
  delta.samples.push_back(std::move(sample));
  OutputText::Step step = text_.Push(result.token(), result.grammar_done());
  delta.text = std::move(step.text);
  request_->Push(std::move(delta));
  if (step.finish_reason.empty()) return false;
  end_ = std::move(step);
  return true;
}

void RequestOutput::Finish(const absl::Status& status) {
  if (finished_) return;
  finished_ = true;
  Outcome o;
  o.status = status;
  if (status.ok()) {
    o.finish_reason = end_.finish_reason;
    o.stop_sequence = end_.stop_sequence;
  }
  o.prompt_tokens = request_->prompt_tokens();
  o.completion_tokens = text_.tokens();
  o.cached_tokens = cached_;
  if (metrics_) metrics_->OnFinished(o, SteadySeconds() - request_->submitted_at());
  request_->Finish(std::move(o));
}

}  // namespace fucina
