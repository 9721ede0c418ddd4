// The output side of one running request: each sampled token becomes what its client is shown
// (OutputText: UTF-8, stop strings, finish reasons), with its sample and the request metrics
// (time to first token, inter-token latency, tokens, the outcome). Scheduler thread only.
#ifndef FUCINA_COORDINATOR_REQUEST_OUTPUT_H_
#define FUCINA_COORDINATOR_REQUEST_OUTPUT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "coordinator/metrics.h"
#include "coordinator/output_text.h"
#include "coordinator/request.h"
#include "worker/worker_client.h"

namespace fucina {

class RequestOutput {
 public:
  // `context`: positions per session (the reply's budget is capped by what the prompt leaves);
  // `cached`: prompt tokens found resident; `metrics` may be null.
  RequestOutput(std::shared_ptr<Request> request, const Tokenizer& tokenizer, int64_t context,
                int64_t cached, Metrics* metrics);

  // One sampled token, pushed to the client with whatever text it completes. True when it ends
  // the reply (a stop or the budget): Complete() it then.
  bool Deliver(const wire::SegmentResult& result);
  // Ends the request: the outcome is published (once) and counted. Complete() is the good end
  // Deliver announced; Fail() any other (cancelled, failed).
  void Complete() { Finish(absl::OkStatus()); }
  void Fail(const absl::Status& status) { Finish(status); }

  Request& request() const { return *request_; }
  const GenerateJob& job() const { return request_->job(); }
  int64_t tokens() const { return text_.tokens(); }
  // Tokens the reply may still take (its budget less what it has).
  int64_t budget_left() const { return text_.max_tokens() - text_.tokens(); }
  int64_t cached() const { return cached_; }

 private:
  std::shared_ptr<Request> request_;
  OutputText text_;
  int64_t cached_;
  Metrics* metrics_;
  double last_token_at_ = 0;
  OutputText::Step end_;  // the step that ended the reply, once Deliver has said so
  bool finished_ = false;

  void Finish(const absl::Status& status);
};

}  // namespace fucina

#endif  // FUCINA_COORDINATOR_REQUEST_OUTPUT_H_
