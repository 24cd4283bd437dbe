#include "kernels/cuda/graph_edges.h"

#include <set>
#include <vector>

#include "kernels/cuda/cuda_utils.h"

namespace ringserve::cuda {

absl::Status LaunchDependentsAtPredecessorStart(cudaGraph_t graph, int* changed) {
  size_t count = 0;
  RS_CUDA_RETURN_IF_ERROR(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &count));
  std::vector<cudaGraphNode_t> from(count), to(count);
  std::vector<cudaGraphEdgeData> data(count);
  RS_CUDA_RETURN_IF_ERROR(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &count));
  // Kernels launched as programmatic dependents themselves (ours) trigger their successors
  // early already; only edges out of the others (cuBLASLt's) change.
  std::set<cudaGraphNode_t> dependents;
  for (size_t i = 0; i < count; ++i) {
    if (data[i].type == cudaGraphDependencyTypeProgrammatic) dependents.insert(to[i]);
  }
  int rewritten = 0;
  for (size_t i = 0; i < count; ++i) {
    if (data[i].type != cudaGraphDependencyTypeProgrammatic ||
        data[i].from_port != cudaGraphKernelNodePortProgrammatic || dependents.contains(from[i])) {
      continue;
    }
    cudaGraphEdgeData early = data[i];
    early.from_port = cudaGraphKernelNodePortLaunchCompletion;
    RS_CUDA_RETURN_IF_ERROR(cudaGraphRemoveDependencies(graph, &from[i], &to[i], &data[i], 1));
    RS_CUDA_RETURN_IF_ERROR(cudaGraphAddDependencies(graph, &from[i], &to[i], &early, 1));
    ++rewritten;
  }
  if (changed != nullptr) *changed = rewritten;
  return absl::OkStatus();
}

}  // namespace ringserve::cuda
