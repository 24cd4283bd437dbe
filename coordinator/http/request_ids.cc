#include "coordinator/http/request_ids.h"

#include "fmt/format.h"

namespace ringserve::http {

std::string ChoiceRequestId(std::string_view request_id, int index) {
  if (index == 0) return std::string(request_id);
  return fmt::format("{}{}{}", request_id, kServerIdMark, index);
}

absl::Status CheckClientRequestId(std::string_view request_id) {
  if (request_id.find(kServerIdMark) == std::string_view::npos) return absl::OkStatus();
  return absl::InvalidArgumentError(
      fmt::format("request_id: must not contain '{}' (ids with it are the server's: its default "
                  "ids and those of a request's choices)",
                  kServerIdMark));
}

}  // namespace ringserve::http
