// What the device MTP drafter (device_mtp_drafter.h) needs from the slice that holds the MTP
// layer and the target's hidden states: on a CUDA last stage CudaModelSlice (through
// cuda_mtp_drafter.h), where the rows never leave the GPU. Rows are h_p after model.norm.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stage/model/model_slice.h"

namespace ringserve {

class MtpDevice {
 public:
  enum class Source { kStore, kLastRun };
  struct Limits {
    int max_tokens = 0;      // tokens per Run
    int max_chunks = 0;      // chunks per Run
    int max_logit_rows = 0;  // logits rows per Run
  };
  struct Outputs {
    std::vector<int32_t> argmax;  // [rows]
    std::vector<float> logits;    // [to_host.size(), vocab]
  };

  virtual ~MtpDevice() = default;

  // The target slice whose runs' final hidden rows this device reads (kLastRun).
  virtual const ModelSlice& target() const = 0;
  virtual int store_rows() const = 0;
  virtual Limits limits() const = 0;
  // Copies rows [run_row, run_row + count) of the target's last run to store rows
  // [store_row, + count).
  virtual absl::Status StoreHidden(int run_row, int count, int store_row) = 0;
  // The MTP layer on `batch` (CpuMtpLayer::Forward's layout), row r's h_p being row
  // hidden_rows[r] of `source`; returns the logits rows computed. Operations run in call order.
  virtual absl::StatusOr<int> Run(const MicroBatch& batch, std::span<const int32_t> hidden_rows,
                                  Source source) = 0;
  // After Run of `rows` logits rows: their argmax, and the logits rows `to_host`.
  virtual absl::StatusOr<Outputs> Results(int rows, std::span<const int> to_host) = 0;
};

}  // namespace ringserve
