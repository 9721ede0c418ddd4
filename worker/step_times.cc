#include "worker/step_times.h"

namespace fucina {

void StepTimes::Add(const StepTimes& o) {
  steps += o.steps;
  for (double StepTimes::*part :
       {&StepTimes::queue, &StepTimes::session_ops, &StepTimes::validate, &StepTimes::input,
        &StepTimes::kernels, &StepTimes::attention, &StepTimes::head, &StepTimes::sampling,
        &StepTimes::output, &StepTimes::send, &StepTimes::chain, &StepTimes::served}) {
    this->*part += o.*part;
  }
}

void StepTimes::ToWire(wire::StepTimes* out) const {
  out->set_steps(steps);
  out->set_queue(queue);
  out->set_session_ops(session_ops);
  out->set_validate(validate);
  out->set_input(input);
  out->set_kernels(kernels);
  out->set_attention(attention);
  out->set_head(head);
  out->set_sampling(sampling);
  out->set_output(output);
  out->set_send(send);
  out->set_chain(chain);
  out->set_served(served);
}

bool IsDecodeStep(const wire::ForwardRequest& request) {
  if (request.segments_size() == 0) return false;
  for (const wire::Segment& seg : request.segments()) {
    if (seg.prefill_only() || seg.all_logits() || seg.token_ids_size() != seg.drafts() + 1) {
      return false;
    }
  }
  return true;
}

}  // namespace fucina
