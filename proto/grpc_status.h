// The one place that converts between gRPC and absl status codes and messages.
#pragma once

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace ringserve {

// Same code, same message. OK maps to OK.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace ringserve
