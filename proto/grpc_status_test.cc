#include "proto/grpc_status.h"

#include "gtest/gtest.h"

namespace ringserve {
namespace {

TEST(GrpcStatusTest, RoundTripsCodeAndMessage) {
  absl::Status original = absl::InvalidArgumentError("hosts.yaml: stages[1].port: not a number");
  grpc::Status wire = ToGrpcStatus(original);
  EXPECT_EQ(wire.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(wire.error_message(), "hosts.yaml: stages[1].port: not a number");
  EXPECT_EQ(FromGrpcStatus(wire), original);
}

TEST(GrpcStatusTest, MapsUnavailableAndOk) {
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::UNAVAILABLE, "gone")).code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(FromGrpcStatus(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "slow")).code(),
            absl::StatusCode::kDeadlineExceeded);
}

}  // namespace
}  // namespace ringserve
