// GpuStream: a CUDA stream handle (cudaStream_t) for interfaces that must not include the CUDA
// headers (they build without the CUDA toolkit).
#pragma once

struct CUstream_st;

namespace ringserve {

using GpuStream = CUstream_st*;  // the same type as cudaStream_t

}  // namespace ringserve
