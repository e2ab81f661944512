/* cuda_graph.c - what a graph launch costs: learnt when a graph is instantiated or updated, and
 * changed by the setters of its nodes (the table is graphs.c's); what its allocation nodes
 * take is counted when it runs (cuda_graph_memory.c). */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "cuda_driver.h"
#include "graphs.h"
#include "log.h"
#include "region.h"
#include "throttle.h"

/* ---- graphs: what a launch costs is learnt when the graph is instantiated ------------------ */

static struct vgpu_graph_api graph_api(void)
{
    return (struct vgpu_graph_api){
        .get_nodes = real.cuGraphGetNodes,
        .node_type = real.cuGraphNodeGetType,
        .kernel_params = real.cuGraphKernelNodeGetParams_v2,
        .kernel_params_v1 = real.cuGraphKernelNodeGetParams,
        .child_graph = real.cuGraphChildGraphNodeGetGraph,
        .memset_params = real.cuGraphMemsetNodeGetParams,
        .alloc_params = real.cuGraphMemAllocNodeGetParams,
        .local_bytes = vgpu_kernel_local_bytes,
    };
}

/* What launching graph will cost, read before the driver is asked to use it: its kernels' blocks
 * under an SM limit, what its allocation nodes take under a memory cap. -1: that cannot be
 * told (logged); the caller answers CUDA_ERROR_OUT_OF_MEMORY with nothing changed. */
static int read_costs(CUgraph graph, struct vgpu_graph_costs *costs)
{
    const struct vgpu_graph_api api = graph_api();
    *costs = (struct vgpu_graph_costs){0};
    if (vgpu_throttle_enabled && vgpu_graph_costs(&api, graph, costs) != 0) {
        vgpu_log(VGPU_LOG_ERROR, "out of host memory reading a CUDA graph's kernels: refused");
        return -1;
    }
    if (vgpu_region_any_limit() &&
        vgpu_graph_memory_read(&api, graph, costs) != 0) {
        vgpu_graph_costs_free(costs);
        vgpu_log(VGPU_LOG_ERROR, "a CUDA graph's allocation nodes cannot be read (out of host "
                 "memory, a node the driver does not describe, or child graphs nested too "
                 "deep): refused, its memory would go uncounted");
        return -1;
    }
    return 0;
}

/* After the driver updated exec (rc its answer): exec now costs costs, under the names of the
 * nodes it was instantiated from. */
static CUresult updated(CUresult rc, CUgraphExec exec, struct vgpu_graph_costs *costs)
{
    struct vgpu_graph_memory before;
    if (rc != CUDA_SUCCESS || (!vgpu_throttle_enabled && costs->memory == NULL))
        vgpu_graph_costs_free(costs);
    else if (vgpu_graph_update(exec, costs) != 0) /* only for an exec not made through us */
        vgpu_log(VGPU_LOG_ERROR, "out of host memory: an updated CUDA graph costs one token");
    /* Its allocations may have changed: mapped anew at its next launch. */
    uint64_t serial = rc == CUDA_SUCCESS ? vgpu_graph_memory_of(exec, &before) : 0;
    if (serial != 0)
        vgpu_graph_mapping_forget(exec, serial);
    return rc;
}

/* Reads graph's allocation nodes again once the driver has instantiated it: another thread may
 * have added some between the first read and the instantiation, and none can be removed from
 * a graph that has one, nor changed (cuda.h), so the larger figures of the two reads bound
 * what the executable graph takes. -1: they cannot be read now. */
static int read_again(CUgraph graph, struct vgpu_graph_costs *costs)
{
    const struct vgpu_graph_api api = graph_api();
    struct vgpu_graph_costs now = {0};
    if (!vgpu_region_any_limit())
        return 0;
    if (vgpu_graph_memory_read(&api, graph, &now) != 0)
        return -1;
    vgpu_graph_memory_merge(costs, &now);
    return 0;
}

/* After the driver made *exec from graph (rc its answer). An executable graph whose cost cannot
 * be kept (no host memory for the table) would run at one token a launch, or its allocations
 * uncounted, so it is destroyed again. */
static CUresult instantiated(CUresult rc, CUgraphExec *exec, CUgraph graph,
                             struct vgpu_graph_costs *costs)
{
    if (rc != CUDA_SUCCESS || exec == NULL) {
        vgpu_graph_costs_free(costs);
        return rc;
    }
    int read = read_again(graph, costs);
    if (read == 0 && !vgpu_throttle_enabled && costs->memory == NULL)
        return rc;
    if (read == 0 && vgpu_graph_remember(*exec, costs) == 0)
        return rc;
    vgpu_graph_costs_free(costs);
    if (real.cuGraphExecDestroy != NULL)
        real.cuGraphExecDestroy(*exec);
    *exec = NULL;
    vgpu_log(VGPU_LOG_ERROR, "out of host memory, or a graph's allocation nodes unreadable: a "
             "CUDA graph was not instantiated");
    return CUDA_ERROR_OUT_OF_MEMORY;
}

VGPU_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph,
                                                 unsigned long long flags)
{
    struct vgpu_graph_costs costs;
    if (!ready() || real.cuGraphInstantiateWithFlags == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (read_costs(graph, &costs) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return instantiated(real.cuGraphInstantiateWithFlags(exec, graph, flags), exec, graph,
                        &costs);
}

typedef CUresult (*instantiate_params_fn)(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *);

/* CUDA 12's instantiation may upload the graph too (CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD), which
 * maps its allocations as a launch would. The driver is asked to instantiate only, and the
 * upload goes through cuGraphUpload's accounting once the graph is read and recorded; refused,
 * the graph is destroyed again, as an instantiation that fails leaves none. */
static CUresult instantiate_with_params(instantiate_params_fn instantiate, graph_launch_fn upload,
                                        CUgraphExec *exec, CUgraph graph,
                                        CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    struct vgpu_graph_costs costs;
    if (read_costs(graph, &costs) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    int uploading = params != NULL && (params->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) != 0 &&
                    vgpu_region_any_limit() && upload != NULL;
    CUDA_GRAPH_INSTANTIATE_PARAMS asked = uploading ? *params : (CUDA_GRAPH_INSTANTIATE_PARAMS){0};
    asked.flags &= ~(cuuint64_t)CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD;
    CUresult rc = instantiated(instantiate(exec, graph, uploading ? &asked : params), exec, graph,
                               &costs);
    if (uploading) {
        params->hErrNode_out = asked.hErrNode_out;
        params->result_out = asked.result_out;
    }
    if (!uploading || rc != CUDA_SUCCESS)
        return rc;
    rc = vgpu_graph_launch(upload, *exec, params->hUploadStream, "cuGraphInstantiateWithParams");
    if (rc != CUDA_SUCCESS) {
        cuGraphExecDestroy(*exec);
        *exec = NULL;
    }
    return rc;
}

VGPU_EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph graph,
                                                  CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    if (!ready() || real.cuGraphInstantiateWithParams == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    return instantiate_with_params(real.cuGraphInstantiateWithParams, real.cuGraphUpload, exec,
                                   graph, params);
}

VGPU_EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *exec, CUgraph graph,
                                                       CUDA_GRAPH_INSTANTIATE_PARAMS *params)
{
    if (!ready() || real.cuGraphInstantiateWithParams_ptsz == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    return instantiate_with_params(real.cuGraphInstantiateWithParams_ptsz,
                                   real.cuGraphUpload_ptsz, exec, graph, params);
}

VGPU_EXPORT CUresult cuGraphExecUpdate_v2(CUgraphExec exec, CUgraph graph,
                                          CUgraphExecUpdateResultInfo *info)
{
    struct vgpu_graph_costs costs;
    if (!ready() || real.cuGraphExecUpdate_v2 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (read_costs(graph, &costs) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return updated(real.cuGraphExecUpdate_v2(exec, graph, info), exec, &costs);
}

/* The CUDA 10/11 ABI (cuda_v1.h), which CUDA 11 builds still call. */
VGPU_EXPORT CUresult cuGraphInstantiate(CUgraphExec *exec, CUgraph graph, CUgraphNode *error_node,
                                        char *log, size_t log_size)
{
    struct vgpu_graph_costs costs;
    if (!ready() || real.cuGraphInstantiate == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (read_costs(graph, &costs) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return instantiated(real.cuGraphInstantiate(exec, graph, error_node, log, log_size), exec,
                        graph, &costs);
}

VGPU_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *exec, CUgraph graph,
                                           CUgraphNode *error_node, char *log, size_t log_size)
{
    struct vgpu_graph_costs costs;
    if (!ready() || real.cuGraphInstantiate_v2 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (read_costs(graph, &costs) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return instantiated(real.cuGraphInstantiate_v2(exec, graph, error_node, log, log_size), exec,
                        graph, &costs);
}

VGPU_EXPORT CUresult cuGraphExecUpdate(CUgraphExec exec, CUgraph graph, CUgraphNode *error_node,
                                       CUgraphExecUpdateResult *result)
{
    struct vgpu_graph_costs costs;
    if (!ready() || real.cuGraphExecUpdate == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (read_costs(graph, &costs) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return updated(real.cuGraphExecUpdate(exec, graph, error_node, result), exec, &costs);
}

/* The entry stays until the driver has destroyed exec, so that a launch racing the destroy is
 * still counted; it is removed then only if it is still that recording: once destroyed,
 * exec's address may be another thread's new graph, recorded under a new serial. */
VGPU_EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec)
{
    if (!ready() || real.cuGraphExecDestroy == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    uint64_t serial = vgpu_graph_serial(exec);
    CUresult rc = real.cuGraphExecDestroy(exec);
    if (rc == CUDA_SUCCESS && serial != 0) {
        vgpu_graph_forget(exec, serial);
        vgpu_graph_mapping_forget(exec, serial);
    }
    return rc;
}

/* ---- graphs changed after instantiation: each setter changes the cost of its node ---------- */

static CUresult node_set(CUresult rc, CUgraphExec exec, CUgraphNode node, uint64_t blocks)
{
    if (rc == CUDA_SUCCESS && vgpu_throttle_enabled)
        vgpu_graph_set_node(exec, node, blocks);
    return rc;
}

/* What a child graph node running child will cost, and what its allocation nodes take (in
 * memory->memory, under a memory cap), read before the driver is asked: -1 when that cannot
 * be told (the caller answers CUDA_ERROR_OUT_OF_MEMORY with nothing changed). */
static int child_cost(CUgraph child, uint64_t *blocks, struct vgpu_graph_costs *memory)
{
    const struct vgpu_graph_api api = graph_api();
    *blocks = 0;
    *memory = (struct vgpu_graph_costs){0};
    if (vgpu_throttle_enabled && vgpu_graph_child_blocks(&api, child, blocks) != 0) {
        vgpu_log(VGPU_LOG_ERROR, "out of host memory reading a CUDA child graph's kernels: "
                 "refused");
        return -1;
    }
    if (vgpu_region_any_limit() && vgpu_graph_memory_read(&api, child, memory) != 0) {
        vgpu_log(VGPU_LOG_ERROR, "a CUDA child graph's allocation nodes cannot be read: "
                 "refused");
        return -1;
    }
    return 0;
}

/* After a setter gave exec a child graph (rc the driver's answer) whose allocation nodes take
 * memory: exec takes at least that, and is mapped anew at its next launch. */
static CUresult child_set(CUresult rc, CUgraphExec exec, struct vgpu_graph_costs *memory)
{
    if (rc == CUDA_SUCCESS && memory->memory != NULL)
        vgpu_graph_mapping_forget(exec, vgpu_graph_more_memory(exec, memory));
    vgpu_graph_costs_free(memory);
    return rc;
}

VGPU_EXPORT CUresult cuGraphExecKernelNodeSetParams_v2(CUgraphExec exec, CUgraphNode node,
                                                       const CUDA_KERNEL_NODE_PARAMS *params)
{
    if (!ready() || real.cuGraphExecKernelNodeSetParams_v2 == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real.cuGraphExecKernelNodeSetParams_v2(exec, node, params);
    return params != NULL
        ? node_set(rc, exec, node, grid(params->gridDimX, params->gridDimY, params->gridDimZ))
        : rc;
}

/* The CUDA 10.1 ABI (cuda_v1.h). */
VGPU_EXPORT CUresult cuGraphExecKernelNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                                    const CUDA_KERNEL_NODE_PARAMS_v1 *params)
{
    if (!ready() || real.cuGraphExecKernelNodeSetParams == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real.cuGraphExecKernelNodeSetParams(exec, node, params);
    return params != NULL
        ? node_set(rc, exec, node, grid(params->gridDimX, params->gridDimY, params->gridDimZ))
        : rc;
}

VGPU_EXPORT CUresult cuGraphExecMemsetNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                                    const CUDA_MEMSET_NODE_PARAMS *params,
                                                    CUcontext ctx)
{
    if (!ready() || real.cuGraphExecMemsetNodeSetParams == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real.cuGraphExecMemsetNodeSetParams(exec, node, params, ctx);
    return params != NULL ? node_set(rc, exec, node, vgpu_graph_memset_blocks(params)) : rc;
}

VGPU_EXPORT CUresult cuGraphExecChildGraphNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                                        CUgraph child)
{
    uint64_t blocks;
    struct vgpu_graph_costs memory;
    if (!ready() || real.cuGraphExecChildGraphNodeSetParams == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (child_cost(child, &blocks, &memory) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real.cuGraphExecChildGraphNodeSetParams(exec, node, child);
    return child_set(node_set(rc, exec, node, blocks), exec, &memory);
}

/* CUDA 12.2's setter of any node: kernels, memsets and child graphs change the cost. */
VGPU_EXPORT CUresult cuGraphExecNodeSetParams(CUgraphExec exec, CUgraphNode node,
                                              CUgraphNodeParams *params)
{
    uint64_t blocks;
    struct vgpu_graph_costs memory;
    if (!ready() || real.cuGraphExecNodeSetParams == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    if (params != NULL && params->type == CU_GRAPH_NODE_TYPE_GRAPH &&
        child_cost(params->graph.graph, &blocks, &memory) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real.cuGraphExecNodeSetParams(exec, node, params);
    if (params != NULL && params->type == CU_GRAPH_NODE_TYPE_KERNEL)
        return node_set(rc, exec, node, grid(params->kernel.gridDimX, params->kernel.gridDimY,
                                             params->kernel.gridDimZ));
    if (params != NULL && params->type == CU_GRAPH_NODE_TYPE_GRAPH)
        return child_set(node_set(rc, exec, node, blocks), exec, &memory);
    if (params != NULL && params->type == CU_GRAPH_NODE_TYPE_MEMSET) {
        CUDA_MEMSET_NODE_PARAMS set; /* the v2 struct leads with the v1 fields (cuda.h) */
        memcpy(&set, &params->memset, sizeof set);
        return node_set(rc, exec, node, vgpu_graph_memset_blocks(&set));
    }
    return rc;
}

/* A disabled node does not run: it costs nothing until it is enabled again. */
VGPU_EXPORT CUresult cuGraphNodeSetEnabled(CUgraphExec exec, CUgraphNode node,
                                           unsigned int enabled)
{
    if (!ready() || real.cuGraphNodeSetEnabled == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real.cuGraphNodeSetEnabled(exec, node, enabled);
    if (rc == CUDA_SUCCESS && vgpu_throttle_enabled)
        vgpu_graph_enable_node(exec, node, enabled != 0);
    return rc;
}
