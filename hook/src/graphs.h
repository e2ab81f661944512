/* graphs.h - what a CUDA graph launch costs the SM limiter: the grid blocks of every kernel
 * node of the graph it was instantiated from (child graphs included), learnt at instantiation,
 * since a CUgraphExec cannot be inspected. */
#ifndef VGPU_GRAPHS_H
#define VGPU_GRAPHS_H

#include <cuda.h>
#include <stdint.h>

/* The driver functions that inspect a graph (any of them NULL: nothing can be learnt). */
struct vgpu_graph_api {
    CUresult (*get_nodes)(CUgraph, CUgraphNode *, size_t *);
    CUresult (*node_type)(CUgraphNode, CUgraphNodeType *);
    CUresult (*kernel_params)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS *);
    CUresult (*child_graph)(CUgraphNode, CUgraph *);
};

/* Grid blocks of all kernel nodes of graph; 0 when they cannot be read. */
uint64_t vgpu_graph_blocks(const struct vgpu_graph_api *api, CUgraph graph);

/* Records what launching exec costs (after an instantiation or an update of it). */
void vgpu_graph_remember(CUgraphExec exec, uint64_t blocks);

/* The recorded cost of exec; 1 for an exec instantiated where we could not see it. */
uint64_t vgpu_graph_cost(CUgraphExec exec);

void vgpu_graph_forget(CUgraphExec exec);

#endif
