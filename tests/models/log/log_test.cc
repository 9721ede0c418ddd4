// The libraries' logger and progress reports: what a sink receives, the stderr layout, and
// that each request's lines in the coordinator carry its id (tests/coordinator covers those).
#include "models/log/log.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace fucina {
namespace {

struct Captured {
  LogSeverity severity;
  std::string file, request_id, message;
  int line;
};

class LogTest : public testing::Test {
 protected:
  void SetUp() override {
    previous_ = SetLogSink([this](const LogLine& l) {
      lines_.push_back({l.severity, std::string(l.file), std::string(l.request_id),
                        std::string(l.message), l.line});
    });
  }
  void TearDown() override { SetLogSink(previous_); }

  std::vector<Captured> lines_;
  LogSink previous_;
};

TEST_F(LogTest, ASinkGetsEachLineWithItsRequestAndPlace) {
  FUCINA_LOG(kInfo).Request("req-7") << "queued: " << 12 << " prompt tokens";
  const int here = __LINE__ - 1;
  FUCINA_LOG(kWarning) << "no request";
  ASSERT_EQ(lines_.size(), 2u);
  EXPECT_EQ(lines_[0].severity, LogSeverity::kInfo);
  EXPECT_EQ(lines_[0].request_id, "req-7");
  EXPECT_EQ(lines_[0].message, "queued: 12 prompt tokens");
  EXPECT_EQ(lines_[0].file, "log_test.cc");  // the base name, not the build's path
  EXPECT_EQ(lines_[0].line, here);
  EXPECT_EQ(lines_[1].severity, LogSeverity::kWarning);
  EXPECT_TRUE(lines_[1].request_id.empty());
}

TEST(LogFormat, StderrLinesFollowGlogsLayoutWithTheRequestId) {
  const std::string text = FormatLogLine({.severity = LogSeverity::kError,
                                          .file = "scheduler.cc",
                                          .line = 125,
                                          .request_id = "chatcmpl-x1",
                                          .message = "failed: boom"});
  // E1206 08:35:12.345678 scheduler.cc:125] [chatcmpl-x1] failed: boom
  EXPECT_EQ(text[0], 'E');
  EXPECT_EQ(text.size(), std::string("E1206 08:35:12.345678 ").size() +
                             std::string("scheduler.cc:125] [chatcmpl-x1] failed: boom").size());
  EXPECT_NE(text.find(" scheduler.cc:125] [chatcmpl-x1] failed: boom"), std::string::npos)
      << text;
  EXPECT_EQ(FormatLogLine({.file = "a.cc", .line = 1, .message = "m"}).find('['),
            std::string::npos);
}

TEST(Progress, ReportsReachTheSinkAndNothingWithoutOne) {
  std::vector<Progress> seen;
  std::vector<std::string> tasks;
  ProgressSink previous = SetProgressSink([&](const Progress& p) {
    seen.push_back(p);
    tasks.emplace_back(p.task);
  });
  ReportProgress({.task = "loading", .done = 5, .total = 10});
  ReportProgress({.task = "loading", .finished = true});
  SetProgressSink(nullptr);
  ReportProgress({.task = "unseen", .done = 1});
  SetProgressSink(previous);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(tasks[0], "loading");
  EXPECT_EQ(seen[0].done, 5);
  EXPECT_EQ(seen[0].total, 10);
  EXPECT_TRUE(seen[1].finished);
}

}  // namespace
}  // namespace fucina
