/* graphs.h - what a CUDA graph launch costs: for the SM limiter, the grid blocks of every kernel
 * node of the graph it was instantiated from (child graphs included), kept per top-level node,
 * so that the setters of an executable graph (a kernel's new grid, a new child graph, a node
 * disabled) change the cost of the node they change; for the memory cap, what its allocation
 * nodes take from each device. Both are learnt at instantiation, since a CUgraphExec cannot be
 * inspected. */
#ifndef VGPU_GRAPHS_H
#define VGPU_GRAPHS_H

#include <cuda.h>
#include <stddef.h>
#include <stdint.h>

/* The driver functions that inspect a graph (any of them NULL: nothing can be learnt). A kernel
 * node's parameters come from CUDA 12's call where the driver has it, else from the CUDA 10 one
 * (a CUDA 11 driver, which an H100 can run on): their grid fields are at the same offsets. */
struct vgpu_graph_api {
    CUresult (*get_nodes)(CUgraph, CUgraphNode *, size_t *);
    CUresult (*node_type)(CUgraphNode, CUgraphNodeType *);
    CUresult (*kernel_params)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS *);
    CUresult (*kernel_params_v1)(CUgraphNode, CUDA_KERNEL_NODE_PARAMS_v1 *);
    CUresult (*child_graph)(CUgraphNode, CUgraph *);
    CUresult (*memset_params)(CUgraphNode, CUDA_MEMSET_NODE_PARAMS *); /* NULL: not read */
    CUresult (*alloc_params)(CUgraphNode, CUDA_MEM_ALLOC_NODE_PARAMS *); /* NULL: none can exist */
    uint64_t (*local_bytes)(CUfunction); /* a kernel's local memory a thread; NULL: not asked */
};

enum { VGPU_GRAPH_DEVICES = 16 }; /* device ordinals told apart: the region's */

/* What a graph's allocation nodes take from each device's graph memory pool when it runs:
 * bytes[d] on device ordinal d, child graphs included (saturating); and the most local memory
 * a thread of its kernels needs (stack: the driver raises the stack for it at the launch). */
struct vgpu_graph_memory {
    uint64_t bytes[VGPU_GRAPH_DEVICES];
    uint64_t stack;
};

/* What each top-level node of a graph costs; nodes that cost nothing (copies, events) are left
 * out. Made by vgpu_graph_costs, owned by the table once remembered. */
struct vgpu_node_cost {
    CUgraphNode node;
    uint64_t blocks;
    uint32_t position; /* its place in the graph's node list; UINT32_MAX: added by a setter */
    int enabled;
};
struct vgpu_graph_costs {
    struct vgpu_node_cost *nodes; /* sorted by node handle */
    size_t count;
    struct vgpu_graph_memory *memory; /* NULL: the graph allocates nothing */
};

/* Frees what costs holds (and leaves it empty). */
void vgpu_graph_costs_free(struct vgpu_graph_costs *costs);

/* The costs of graph's top-level nodes (empty when they cannot be read); 0, or -1 when out of
 * host memory anywhere in it (costs is then empty). Read before the driver is asked to use the
 * graph, so that a failure here leaves everything as it was. */
int vgpu_graph_costs(const struct vgpu_graph_api *api, CUgraph graph,
                     struct vgpu_graph_costs *costs);

/* What a memset node of these parameters costs: the memset exports' charge for the bytes it
 * sets (vgpu_memset_blocks, throttle.h), saturating. */
uint64_t vgpu_graph_memset_blocks(const CUDA_MEMSET_NODE_PARAMS *p);

/* What graph's allocation nodes take when it runs, into costs->memory (NULL when nothing); 0,
 * or -1 when that cannot be told (out of host memory, an allocation node the driver does not
 * describe, child graphs nested past 64 levels): the caller refuses the graph, whose memory
 * would go uncounted. */
int vgpu_graph_memory_read(const struct vgpu_graph_api *api, CUgraph graph,
                           struct vgpu_graph_costs *costs);

/* into->memory becomes the larger, on each device, of its own and from->memory (taken). */
void vgpu_graph_memory_merge(struct vgpu_graph_costs *into, struct vgpu_graph_costs *from);

/* What a child graph node running graph costs: *blocks, the grid blocks of all its kernel nodes
 * (0 when they cannot be read); -1 when out of host memory. */
int vgpu_graph_child_blocks(const struct vgpu_graph_api *api, CUgraph graph, uint64_t *blocks);

/* Records what launching exec costs, after an instantiation or an update of it. Takes costs
 * (left empty) in any case; -1 when the table could not grow (out of memory). */
int vgpu_graph_remember(CUgraphExec exec, struct vgpu_graph_costs *costs);

/* After exec was updated to a graph of the same topology (cuGraphExecUpdate): exec now costs
 * costs, read from that graph, but its nodes keep the names of the graph it was instantiated
 * from, which the setters are given. The two graphs' nodes are paired by their place in the
 * node lists; the driver pairs them by topology, which agrees for graphs built in the same
 * order (where it does not, a node's cost is misplaced until a setter names it, and the NVML
 * feedback holds the rate meanwhile). Every node counts as enabled again, and nodes added by
 * setters are dropped (a setter naming one adds it again): never less than what runs. What its
 * allocation nodes take becomes, on each device, the larger of before and costs->memory's.
 * Takes costs; -1 when the table could not grow (exec was not known: out of memory). */
int vgpu_graph_update(CUgraphExec exec, struct vgpu_graph_costs *costs);

/* A setter gave exec's node a child graph whose allocation nodes take costs->memory (taken):
 * what exec takes becomes the larger, on each device (never less than what may run). Returns
 * exec's serial (0: it could not be recorded). */
uint64_t vgpu_graph_more_memory(CUgraphExec exec, struct vgpu_graph_costs *costs);

/* An executable graph's node now costs `blocks` (a setter changed it). A node the table does not
 * know (its cost could not be read at instantiation) is added: never less than what runs. */
void vgpu_graph_set_node(CUgraphExec exec, CUgraphNode node, uint64_t blocks);

/* A node of an executable graph enabled or disabled (cuGraphNodeSetEnabled): a disabled node
 * does not run, so it costs nothing until enabled again. */
void vgpu_graph_enable_node(CUgraphExec exec, CUgraphNode node, int enabled);

/* The recorded cost of exec (at most INT64_MAX); 1 for an exec instantiated where we could not
 * see it; an unreadable graph's (2^10 blocks) when the calling thread is changing the table (a
 * signal handler's launch: locks.h). */
uint64_t vgpu_graph_cost(CUgraphExec exec);

/* What exec's allocation nodes take, copied into *memory; returns the serial of exec's
 * recording (below), or 0 when it takes nothing (or is unknown), or VGPU_GRAPH_UNKNOWN_SERIAL
 * when the calling thread is changing the table (a signal handler's launch: locks.h), nothing
 * copied. */
static const uint64_t VGPU_GRAPH_UNKNOWN_SERIAL = UINT64_MAX;
uint64_t vgpu_graph_memory_of(CUgraphExec exec, struct vgpu_graph_memory *memory);

/* Which recording of exec the table holds: a serial, new at each vgpu_graph_remember (the
 * driver hands a destroyed graph's address out again); 0 when exec is unknown. */
uint64_t vgpu_graph_serial(CUgraphExec exec);

/* Removes exec from the table once the driver has destroyed it, if it is still the recording
 * `serial` (else it is another thread's new graph at the same address, and stays); 0 when
 * removed, else -1. Kept until the destroy returns, so that a launch racing it is counted. */
int vgpu_graph_forget(CUgraphExec exec, uint64_t serial);

#endif
