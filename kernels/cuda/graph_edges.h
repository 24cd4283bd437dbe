// Earlier programmatic launches inside a captured CUDA graph. Stream capture turns each
// LaunchDependent (dependent_launch.cuh) into a programmatic edge that fires when every block of
// the previous kernel has called launch_dependents or exited. cuBLASLt's GEMM kernels never call
// it, so the small kernel after a GEMM is only launched once the GEMM has drained. Moving those
// edges to the launch-completion port lets the dependent be launched as soon as every block of
// its predecessor has started; its griddepcontrol.wait still waits for the predecessor to
// complete and its writes to be visible, so results are unchanged — only the launch latency
// hides behind the running kernel. The CUDA slice applies it to its decode graphs when its
// KernelPlan has early_graph_launch.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"

namespace ringserve::cuda {

// Rewrites the programmatic edges of `graph` (before instantiation) that leave a kernel which was
// not itself launched as a programmatic dependent (a cuBLASLt GEMM) to fire at launch
// completion. Returns the number of edges changed through `changed` when not null.
absl::Status LaunchDependentsAtPredecessorStart(cudaGraph_t graph, int* changed = nullptr);

}  // namespace ringserve::cuda
