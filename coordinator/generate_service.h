// The client API (ringserve.v1.Generate, proto/generate.proto) over an Engine. A Generate call
// streams the engine's events; when the client goes away (cancellation or a failed write) the
// request is cancelled in the engine, which frees its KV blocks.
//
// Requests are validated as the HTTP API validates them: a prompt longer than the context, or
// max_tokens beyond what the context leaves, is INVALID_ARGUMENT (never silently cut); text far
// longer in bytes than the context can hold is refused before tokenizing. With
// GenerateServiceOptions::api_key set, every call but Health needs the metadata
// "authorization: Bearer <key>" (UNAUTHENTICATED otherwise; compared in constant time).
//
// Request ids (coordinator/http/request_ids.h): a client-chosen id must not contain '#'
// (INVALID_ARGUMENT); without one the server makes "grpc#<n>". Choice i > 0 of a request runs
// in the engine as "<id>#<i>", an id no other client can hold; responses carry the request's
// id and the choice's index.
//
// A new Generate call while the engine's ring is down and re-forming is refused at once with
// UNAVAILABLE ("... retry later"; coordinator/ring_engine.h); calls already running wait for the
// ring and resume.
//
// Thread-safe; `engine` must outlive the service.
#pragma once

#include <atomic>
#include <functional>
#include <string>

#include "coordinator/engine.h"
#include "coordinator/http/metrics.h"
#include "proto/generate.grpc.pb.h"

namespace ringserve {

struct GenerateServiceOptions {
  int default_max_tokens = 16;  // when a request says 0
  int num_stages = 0;           // reported by ModelInfo
  // Serving state for Health: (serving, message).
  std::function<std::pair<bool, std::string>()> health{};
  // Where Generate calls are counted (latency histograms, outcomes under api "grpc"), shared
  // with the HTTP API; nullptr = not counted.
  http::ServingMetrics* metrics = nullptr;
  // Required bearer token (the HTTP API's key); empty = none.
  std::string api_key{};
  // Generate calls admitted at once; more get RESOURCE_EXHAUSTED. 0 = no limit.
  int max_concurrent_requests = 256;
};

class GenerateService final : public v1::Generate::Service {
 public:
  GenerateService(Engine* engine, GenerateServiceOptions options);

  grpc::Status Generate(grpc::ServerContext* context, const v1::GenerateRequest* request,
                        grpc::ServerWriter<v1::GenerateResponse>* writer) override;
  grpc::Status Tokenize(grpc::ServerContext* context, const v1::TokenizeRequest* request,
                        v1::TokenizeResponse* response) override;
  grpc::Status Detokenize(grpc::ServerContext* context, const v1::DetokenizeRequest* request,
                          v1::DetokenizeResponse* response) override;
  grpc::Status ModelInfo(grpc::ServerContext* context, const v1::ModelInfoRequest* request,
                         v1::ModelInfoResponse* response) override;
  grpc::Status Health(grpc::ServerContext* context, const v1::HealthRequest* request,
                      v1::HealthResponse* response) override;
  grpc::Status Stats(grpc::ServerContext* context, const v1::StatsRequest* request,
                     v1::StatsResponse* response) override;

 private:
  grpc::Status CheckAuthorized(const grpc::ServerContext* context) const;

  Engine* engine_;
  GenerateServiceOptions options_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<int> active_{0};
};

}  // namespace ringserve
