// CallCap: how many calls of one long-lived gRPC method are served at once.
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "coordinator/grpc_services.h"

namespace fucina {
namespace {

TEST(CallCapTest, RefusesBeyondItsLimitAndTakesPlacesBack) {
  CallCap cap("WatchJob", 3);
  std::vector<CallCap::Hold> held;
  for (int i = 0; i < 3; ++i) {
    auto hold = cap.Take();
    ASSERT_TRUE(hold.ok()) << hold.status();
    held.push_back(*std::move(hold));
  }
  EXPECT_EQ(cap.in_use(), 3);
  auto refused = cap.Take();
  EXPECT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("WatchJob"), std::string::npos);
  EXPECT_EQ(cap.in_use(), 3);  // a refusal holds nothing
  held.pop_back();
  EXPECT_EQ(cap.in_use(), 2);
  EXPECT_TRUE(cap.Take().ok());  // taken and given back at once
  EXPECT_EQ(cap.in_use(), 2);
  held.clear();
  EXPECT_EQ(cap.in_use(), 0);
}

}  // namespace
}  // namespace fucina
