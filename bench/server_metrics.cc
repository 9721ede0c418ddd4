#include "bench/server_metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace fucina::cli {


// GET http://ADDRESS/metrics (HTTP/1.0, so the body ends with the connection); "" on failure.
std::string ScrapeMetrics(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) return "";
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  timeval tv{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(port));
  std::string response;
  if (inet_pton(AF_INET, address.substr(0, colon).c_str(), &sa.sin_addr) == 1 &&
      connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0) {
    const std::string req = "GET /metrics HTTP/1.0\r\nHost: " + address + "\r\n\r\n";
    if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
      char buf[16384];
      for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) response.append(buf, n);
    }
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// The sum of the samples of `name` whose labels contain every one of `label`'s comma-separated
// pairs, in any order (e.g. direction="sent", or kind="decode",part="queue"); nullopt when
// there is none. Label values must not hold `",`.
std::optional<double> MetricSum(const std::string& text, const std::string& name,
                                const std::string& label) {
  std::vector<std::string> pairs = absl::StrSplit(label, "\",", absl::SkipEmpty());
  for (size_t i = 0; i + 1 < pairs.size(); ++i) pairs[i] += "\"";
  std::optional<double> sum;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::ConsumePrefix(&line, name) || line.empty()) continue;
    if (line[0] != '{' && line[0] != ' ') continue;  // a longer name sharing the prefix
    const size_t close = line[0] == '{' ? line.find('}') : 0;
    if (close == absl::string_view::npos) continue;
    const absl::string_view labels = line.substr(0, close);
    if (!std::all_of(pairs.begin(), pairs.end(), [&](const std::string& pair) {
          return labels.find(pair) != absl::string_view::npos;
        })) {
      continue;
    }
    std::vector<absl::string_view> rest =
        absl::StrSplit(line.substr(close + 1), ' ', absl::SkipEmpty());
    double v;
    if (!rest.empty() && absl::SimpleAtod(rest[0], &v)) sum = sum.value_or(0) + v;
  }
  return sum;
}

// "X sent / Y received" bytes per generated token of a counter with a direction label, its
// total when it has no such label, "n/a" when the server does not export it.
std::string PerToken(const std::string& before, const std::string& after, const std::string& name,
                     double tokens) {
  auto delta = [&](const std::string& label) -> std::optional<double> {
    auto a = MetricSum(after, name, label);
    if (!a) return std::nullopt;
    return *a - MetricSum(before, name, label).value_or(0);
  };
  if (!delta("") || tokens <= 0) return "n/a";
  auto sent = delta("direction=\"sent\"");
  auto received = delta("direction=\"received\"");
  if (!sent && !received) return absl::StrFormat("%.0f", *delta("") / tokens);
  return absl::StrFormat("%.0f sent / %.0f received", sent.value_or(0) / tokens,
                         received.value_or(0) / tokens);
}

// The per-step breakdown of the served path (ms per step) from the counters of the coordinator
// (fucina_coordinator_step_seconds_total) and of each stage's worker, in stage order
// (fucina_worker_step_seconds_total), scraped before and after a measurement. Each part is
// measured where it happens; the transport of a call is the caller's wait minus the callee's
// own time (worker/step_times.h). The remainder is the step's time (measured on its own) minus
// every part.
std::string StepBreakdown(const std::string& coordinator_before,
                          const std::string& coordinator_after,
                          const std::vector<std::pair<std::string, std::string>>& stages) {
  auto delta = [](const std::string& before, const std::string& after, const std::string& name,
                  const std::string& label) -> std::optional<double> {
    auto a = MetricSum(after, name, label);
    if (!a) return std::nullopt;
    return *a - MetricSum(before, name, label).value_or(0);
  };
  // Decode steps only: the aggregate rate is measured on decode, and prompt chunks cost orders
  // of magnitude more per step.
  const std::string decode = "kind=\"decode\"";
  const auto steps =
      delta(coordinator_before, coordinator_after, "fucina_coordinator_steps_total", decode);
  if (!steps || *steps <= 0) return "    no decode step counters on the coordinator\n";
  auto coordinator = [&](const char* part) {
    return delta(coordinator_before, coordinator_after, "fucina_coordinator_step_seconds_total",
                 absl::StrCat(decode, ",part=\"", part, "\"")).value_or(0) * 1000 / *steps;
  };
  const double step = coordinator("step"), assemble = coordinator("assemble"),
               round_trip = coordinator("round_trip"), mailbox = coordinator("mailbox"),
               reply = coordinator("reply"), output_text = coordinator("output_text");
  std::string out = absl::StrFormat(
      "    %.0f decode steps, %.3f ms each (assembly to reply handled); ms per step:\n"
      "    coordinator  assemble %.3f  mailbox %.3f  reply %.3f (output text %.3f)\n",
      *steps, step, assemble, mailbox, reply, output_text);
  // A stage's task, less `send`: handing a step on is the start of the next call, so it is
  // shown with that call's transport (the caller's wait for the next stage includes it).
  static const char* kTask[] = {"session_ops", "validate", "input", "kernels", "attention",
                                "head", "sampling", "output"};
  double parts = assemble + mailbox + reply;
  double caller_wait = round_trip;  // what the caller of the next stage waited for it
  double sent_before = 0;           // the previous stage's time handing the step on
  for (size_t i = 0; i < stages.size(); ++i) {
    const auto& [before, after] = stages[i];
    const auto worker_steps = delta(before, after, "fucina_worker_steps_total", decode);
    if (!worker_steps || *worker_steps <= 0) {
      absl::StrAppend(&out, "    stage ", i, ": no decode step counters\n");
      return out;
    }
    auto part = [&](const char* name) {
      return delta(before, after, "fucina_worker_step_seconds_total",
                   absl::StrCat(decode, ",part=\"", name, "\"")).value_or(0) * 1000 /
             *worker_steps;
    };
    const double served = part("served"), queue = part("queue"), chain = part("chain");
    const double transport = caller_wait - served;
    absl::StrAppend(&out, absl::StrFormat("    transport to stage %d  %.3f%s\n", i, transport,
                                          i == 0 ? "" : absl::StrFormat(" (sending %.3f)",
                                                                        sent_before)));
    sent_before = part("send");
    std::string line = absl::StrFormat("    stage %d (%.0f steps)  queue %.3f", i, *worker_steps,
                                       queue);
    double task = 0;
    for (const char* name : kTask) {
      const double v = part(name);
      task += v;
      if (v > 0.0005) absl::StrAppend(&line, absl::StrFormat("  %s %.3f", name, v));
    }
    // The stage's time not in its task, its queue or its wait for the next stage: callbacks,
    // the chained reply's merge.
    const double gap = served - queue - task - (i + 1 < stages.size() ? chain : 0);
    absl::StrAppend(&out, line, absl::StrFormat("  (not in a part: %.3f)\n", gap));
    parts += transport + queue + task;
    caller_wait = chain;
  }
  const double rest = step - parts;
  absl::StrAppend(&out, absl::StrFormat(
                            "    parts %.3f of %.3f ms: unaccounted %.3f ms (%.1f%%)\n", parts,
                            step, rest, step > 0 ? 100 * rest / step : 0));
  return out;
}

}  // namespace fucina::cli
