// The MTP drafter of a CUDA last stage: DeviceMtpDrafter (device_mtp_drafter.h) over the CUDA
// slice's MTP layer (CudaModelSlice::RunMtp, stage/cuda/cuda_mtp_layer.h), its hidden store and
// its final hidden rows, which stay on the GPU.
#pragma once

#include <memory>

#include "stage/cuda/cuda_model_slice.h"
#include "stage/speculative/drafter.h"

namespace ringserve {

// `target`: the CUDA last slice with its MTP layer (target->mtp() non-null); not owned.
std::unique_ptr<Drafter> NewCudaMtpDrafter(cuda::CudaModelSlice* target);

}  // namespace ringserve
