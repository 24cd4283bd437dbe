// Status propagation helpers over absl::Status / absl::StatusOr.
//
//   RS_RETURN_IF_ERROR(DoThing());            // returns the status if not ok
//   RS_ASSIGN_OR_RETURN(auto value, MakeIt()); // unwraps a StatusOr or returns its status
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define RS_STATUS_CONCAT_INNER(a, b) a##b
#define RS_STATUS_CONCAT(a, b) RS_STATUS_CONCAT_INNER(a, b)

#define RS_RETURN_IF_ERROR(expr)             \
  do {                                       \
    ::absl::Status rs_status_ = (expr);      \
    if (!rs_status_.ok()) return rs_status_; \
  } while (0)

#define RS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return std::move(tmp).status(); \
  lhs = std::move(tmp).value()

#define RS_ASSIGN_OR_RETURN(lhs, expr) \
  RS_ASSIGN_OR_RETURN_IMPL(RS_STATUS_CONCAT(rs_statusor_, __LINE__), lhs, expr)
