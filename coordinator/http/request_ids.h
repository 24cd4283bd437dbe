// The engine request ids the client APIs (gRPC Generate, the OpenAI HTTP API) submit under.
//
// Both APIs submit to one engine, in which a running request id is unique: whoever holds an id
// first makes every later request of that id fail. gRPC clients choose their ids, so an id the
// server derives for a client's request must be one no other client can hold. Ids containing
// kServerIdMark are therefore the server's: a client-chosen id with it is refused
// (CheckClientRequestId), and every id the server derives for a request contains it — the
// engine ids of choices 1..n-1 (ChoiceRequestId) and gRPC's default ids. The OpenAI API's ids
// are the server's own and random ("chatcmpl-<hex>", the form OpenAI clients expect); their
// choices follow the same rule.
//
// Pure functions; thread-safe.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace ringserve::http {

inline constexpr char kServerIdMark = '#';

// The engine request id of choice `index` (0 <= index < kMaxChoices) of the request
// `request_id`: request_id itself for 0, "<request_id>#<index>" else.
std::string ChoiceRequestId(std::string_view request_id, int index);

// OK for an id a client may choose: InvalidArgument naming the field `request_id` when it
// contains kServerIdMark.
absl::Status CheckClientRequestId(std::string_view request_id);

}  // namespace ringserve::http
