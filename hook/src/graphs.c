/* graphs.c - the cost of CUDA graph launches for the SM limiter. A graph replays many kernels
 * with one call; counted as one token it ran at 31 % under a 25 % limit on an H100. */
#define _GNU_SOURCE
#include "graphs.h"

#include <pthread.h>
#include <stdlib.h>

enum {
    TABLE_SIZE = 4096, /* live executable graphs; beyond that, new ones cost 1 token */
    MAX_DEPTH = 8,     /* child graphs nested deeper than this are not counted */
};

static struct {
    CUgraphExec exec; /* NULL: free */
    uint64_t blocks;
} table[TABLE_SIZE];
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static char tombstone_byte;
static const CUgraphExec tombstone = (CUgraphExec)(void *)&tombstone_byte; /* a removed entry */

static size_t home(CUgraphExec exec)
{
    return (size_t)(((uintptr_t)exec * UINT64_C(0x9e3779b97f4a7c15)) >> 52) & (TABLE_SIZE - 1);
}

static uint64_t blocks_of(const struct vgpu_graph_api *api, CUgraph graph, int depth)
{
    size_t count = 0;
    if (depth > MAX_DEPTH || api->get_nodes(graph, NULL, &count) != CUDA_SUCCESS || count == 0)
        return 0;
    CUgraphNode *nodes = calloc(count, sizeof *nodes);
    if (nodes == NULL)
        return 0;
    uint64_t total = 0;
    if (api->get_nodes(graph, nodes, &count) == CUDA_SUCCESS) {
        for (size_t i = 0; i < count; i++) {
            CUgraphNodeType type;
            if (api->node_type(nodes[i], &type) != CUDA_SUCCESS)
                continue;
            CUDA_KERNEL_NODE_PARAMS params;
            CUgraph child;
            if (type == CU_GRAPH_NODE_TYPE_KERNEL &&
                api->kernel_params(nodes[i], &params) == CUDA_SUCCESS)
                total += (uint64_t)params.gridDimX * params.gridDimY * params.gridDimZ;
            else if (type == CU_GRAPH_NODE_TYPE_GRAPH &&
                     api->child_graph(nodes[i], &child) == CUDA_SUCCESS)
                total += blocks_of(api, child, depth + 1);
        }
    }
    free(nodes);
    return total;
}

uint64_t vgpu_graph_blocks(const struct vgpu_graph_api *api, CUgraph graph)
{
    if (api->get_nodes == NULL || api->node_type == NULL || api->kernel_params == NULL ||
        api->child_graph == NULL || graph == NULL)
        return 0;
    return blocks_of(api, graph, 0);
}

void vgpu_graph_remember(CUgraphExec exec, uint64_t blocks)
{
    if (exec == NULL || exec == tombstone)
        return;
    pthread_mutex_lock(&table_lock);
    size_t free_at = TABLE_SIZE;
    for (size_t n = 0, i = home(exec); n < TABLE_SIZE; n++, i = (i + 1) & (TABLE_SIZE - 1)) {
        if (table[i].exec == exec) {
            free_at = i;
            break;
        }
        if (table[i].exec == tombstone && free_at == TABLE_SIZE)
            free_at = i;
        if (table[i].exec == NULL) {
            if (free_at == TABLE_SIZE)
                free_at = i;
            break;
        }
    }
    if (free_at != TABLE_SIZE) {
        table[free_at].exec = exec;
        table[free_at].blocks = blocks;
    }
    pthread_mutex_unlock(&table_lock);
}

uint64_t vgpu_graph_cost(CUgraphExec exec)
{
    uint64_t blocks = 0;
    pthread_mutex_lock(&table_lock);
    for (size_t n = 0, i = home(exec); n < TABLE_SIZE && table[i].exec != NULL;
         n++, i = (i + 1) & (TABLE_SIZE - 1)) {
        if (table[i].exec == exec) {
            blocks = table[i].blocks;
            break;
        }
    }
    pthread_mutex_unlock(&table_lock);
    return blocks != 0 ? blocks : 1;
}

void vgpu_graph_forget(CUgraphExec exec)
{
    pthread_mutex_lock(&table_lock);
    for (size_t n = 0, i = home(exec); n < TABLE_SIZE && table[i].exec != NULL;
         n++, i = (i + 1) & (TABLE_SIZE - 1)) {
        if (table[i].exec == exec) {
            table[i].exec = tombstone;
            break;
        }
    }
    pthread_mutex_unlock(&table_lock);
}
