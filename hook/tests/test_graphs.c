/* test_graphs.c - what a CUDA graph launch costs the SM limiter (src/graphs.c), over graphs of
 * the test's own: a graph's top-level nodes costed (kernels, child graphs nested up to the
 * limit, other nodes left out), each exec-level setter changing its node's cost (a kernel's grid,
 * a child graph, a node unknown at instantiation, a node disabled and enabled), memset nodes
 * costed by what they set, an update (costs
 * from the new graph, nodes named by the first), grids that would wrap a 64-bit sum, graphs
 * that cannot be read, a table of more executable graphs than the old fixed one held, running
 * out of host memory at each allocation, and a fork while the table's lock is held (calloc and
 * realloc are wrapped by the linker: --wrap); and what a graph's allocation nodes take on each
 * device, kept per executable graph. */
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "graphs.h"
#include "storm.h"

/* ---- allocation failures on demand ---- */
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t size);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t size);
static int fail_in; /* the fail_in-th allocation from now fails; 0: none does */

static int fails(void) { return fail_in > 0 && --fail_in == 0; }

/* A fork on demand: the fork_in-th calloc from now forks first; the child runs fork_child and
 * never returns into the caller (as if the forking thread were another), the parent keeps the
 * child's wait status in forked_status. */
static int fork_in;
static void (*fork_child)(void);
static int forked_status = -1;

static void fork_here(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        fork_child();
        _exit(0);
    }
    if (pid < 0 || waitpid(pid, &forked_status, 0) != pid)
        forked_status = -2;
}

void *__wrap_calloc(size_t n, size_t size)
{
    if (fork_in > 0 && --fork_in == 0)
        fork_here();
    return fails() ? NULL : __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t size) { return fails() ? NULL : __real_realloc(p, size); }

/* ---- the test's graphs ---- */
enum { MAX_NODES = 16 };
struct tgraph;
struct tnode {
    CUgraphNodeType type;
    unsigned grid[3];
    struct tgraph *child;
    int unreadable; /* its parameters cannot be read */
    uint64_t bytes; /* MEM_ALLOC: its size, on device dev; KERNEL: local memory a thread;
                     * MEMSET: its width in 4-byte elements (one row) */
    int dev;
};
struct tgraph {
    struct tnode *nodes[MAX_NODES];
    size_t count;
    int fails;     /* get_nodes fails */
    size_t shrink; /* nodes gone between the count and the listing */
    size_t repeat; /* not 0: lists its first node this many times (a graph too big to build) */
};

static CUresult get_nodes(CUgraph graph, CUgraphNode *nodes, size_t *count)
{
    struct tgraph *g = (struct tgraph *)graph;
    if (g->fails)
        return CUDA_ERROR_INVALID_VALUE;
    if (nodes == NULL) {
        *count = g->repeat ? g->repeat : g->count;
        return CUDA_SUCCESS;
    }
    size_t n = (g->repeat ? g->repeat : g->count) - g->shrink;
    for (size_t i = 0; i < *count; i++)
        nodes[i] = i < n ? (CUgraphNode)g->nodes[g->repeat ? 0 : i] : NULL;
    *count = n;
    return CUDA_SUCCESS;
}

static CUresult node_type(CUgraphNode node, CUgraphNodeType *type)
{
    *type = ((struct tnode *)node)->type;
    return CUDA_SUCCESS;
}

static CUresult kernel_params(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS *params)
{
    const struct tnode *n = (const struct tnode *)node;
    if (n->type != CU_GRAPH_NODE_TYPE_KERNEL || n->unreadable)
        return CUDA_ERROR_INVALID_VALUE;
    *params = (CUDA_KERNEL_NODE_PARAMS){.func = (CUfunction)(void *)n, .gridDimX = n->grid[0],
                                        .gridDimY = n->grid[1], .gridDimZ = n->grid[2]};
    return CUDA_SUCCESS;
}

static CUresult child_graph(CUgraphNode node, CUgraph *graph)
{
    const struct tnode *n = (const struct tnode *)node;
    if (n->type != CU_GRAPH_NODE_TYPE_GRAPH)
        return CUDA_ERROR_INVALID_VALUE;
    *graph = (CUgraph)n->child;
    return CUDA_SUCCESS;
}

static CUresult alloc_params(CUgraphNode node, CUDA_MEM_ALLOC_NODE_PARAMS *params)
{
    const struct tnode *n = (const struct tnode *)node;
    if (n->type != CU_GRAPH_NODE_TYPE_MEM_ALLOC || n->unreadable)
        return CUDA_ERROR_INVALID_VALUE;
    *params = (CUDA_MEM_ALLOC_NODE_PARAMS){.bytesize = n->bytes};
    params->poolProps.location = (CUmemLocation){.type = CU_MEM_LOCATION_TYPE_DEVICE,
                                                 .id = n->dev};
    return CUDA_SUCCESS;
}

static CUresult memset_params(CUgraphNode node, CUDA_MEMSET_NODE_PARAMS *params)
{
    const struct tnode *n = (const struct tnode *)node;
    if (n->type != CU_GRAPH_NODE_TYPE_MEMSET || n->unreadable)
        return CUDA_ERROR_INVALID_VALUE;
    *params = (CUDA_MEMSET_NODE_PARAMS){.elementSize = 4, .width = n->bytes, .height = 1};
    return CUDA_SUCCESS;
}

static uint64_t kernel_local(CUfunction f)
{
    return f != NULL ? ((const struct tnode *)(const void *)f)->bytes : 0;
}

/* The CUDA 10 ABI: the fields before the CUDA 12 ones. */
static CUresult kernel_params_v1(CUgraphNode node, CUDA_KERNEL_NODE_PARAMS_v1 *params)
{
    CUDA_KERNEL_NODE_PARAMS full;
    CUresult rc = kernel_params(node, &full);
    if (rc == CUDA_SUCCESS)
        memcpy(params, &full, sizeof *params);
    return rc;
}

static const struct vgpu_graph_api api = {.get_nodes = get_nodes, .node_type = node_type,
                                          .kernel_params = kernel_params,
                                          .child_graph = child_graph,
                                          .alloc_params = alloc_params,
                                          .memset_params = memset_params};

enum { POOL = 256 };
static struct tnode nodes[POOL];
static size_t used_nodes;

static struct tnode *fresh(void)
{
    if (used_nodes == POOL)
        abort(); /* the test's own pool: make POOL larger */
    return &nodes[used_nodes++];
}

static struct tnode *kernel(unsigned x, unsigned y, unsigned z)
{
    struct tnode *n = fresh();
    *n = (struct tnode){.type = CU_GRAPH_NODE_TYPE_KERNEL, .grid = {x, y, z}};
    return n;
}

static struct tnode *other(CUgraphNodeType type)
{
    struct tnode *n = fresh();
    *n = (struct tnode){.type = type};
    return n;
}

static struct tnode *child(struct tgraph *g)
{
    struct tnode *n = other(CU_GRAPH_NODE_TYPE_GRAPH);
    n->child = g;
    return n;
}

static struct tnode *allocation(uint64_t bytes, int dev)
{
    struct tnode *n = other(CU_GRAPH_NODE_TYPE_MEM_ALLOC);
    n->bytes = bytes;
    n->dev = dev;
    return n;
}

static void add(struct tgraph *g, struct tnode *n) { g->nodes[g->count++] = n; }

static CUgraph handle(struct tgraph *g) { return (CUgraph)g; }

/* An executable graph's handle: any distinct pointer does. */
static char exec_bytes[20000];
static CUgraphExec exec_at(size_t i) { return (CUgraphExec)(void *)&exec_bytes[i]; }

/* What cuGraphExecDestroy does when the driver destroys exec. */
static void forget(CUgraphExec exec)
{
    vgpu_graph_forget(exec, vgpu_graph_serial(exec));
}

static unsigned long long cost(CUgraphExec exec) { return vgpu_graph_cost(exec); }

/* Instantiates: costs graph and remembers it for exec; 0 on success. */
static int instantiate(CUgraphExec exec, struct tgraph *g)
{
    struct vgpu_graph_costs costs;
    return vgpu_graph_costs(&api, handle(g), &costs) == 0 ? vgpu_graph_remember(exec, &costs) : -1;
}

static void setters(void)
{
    struct tgraph inner = {0}, g = {0};
    add(&inner, kernel(5, 1, 1));
    add(&inner, kernel(5, 1, 1));
    struct tnode *k10 = kernel(10, 1, 1), *k20 = kernel(2, 5, 2), *copy = other(CU_GRAPH_NODE_TYPE_MEMCPY);
    struct tnode *sub = child(&inner);
    add(&g, k10);
    add(&g, copy);
    add(&g, sub);
    add(&g, k20);
    struct vgpu_graph_costs costs;
    int rc = vgpu_graph_costs(&api, handle(&g), &costs);
    check(rc == 0 && costs.count == 3,
          "a graph's kernel and child graph nodes are costed, its copy node left out (%zu)",
          costs.count);
    int sorted = 1;
    for (size_t i = 1; i < costs.count; i++)
        sorted &= (uintptr_t)costs.nodes[i - 1].node < (uintptr_t)costs.nodes[i].node;
    check(sorted, "the costs are sorted by node handle");
    CUgraphExec e = exec_at(1);
    check(vgpu_graph_remember(e, &costs) == 0 && costs.nodes == NULL && costs.count == 0,
          "remembered: the table took the costs");
    check(vgpu_graph_cost(e) == 40, "ten, twenty and a child graph of ten blocks cost 40: %llu",
          cost(e));

    vgpu_graph_set_node(e, (CUgraphNode)k10, 1000);
    check(vgpu_graph_cost(e) == 1030, "a kernel set to 1000 blocks: 1030 (%llu)",
          cost(e));
    struct tgraph bigger = {0};
    add(&bigger, kernel(7, 1, 1));
    uint64_t child_blocks;
    rc = vgpu_graph_child_blocks(&api, handle(&bigger), &child_blocks);
    vgpu_graph_set_node(e, (CUgraphNode)sub, child_blocks);
    check(vgpu_graph_cost(e) == 1027, "the child graph replaced by one of 7 blocks: 1027 (%llu)",
          cost(e));
    struct tnode *unknown = kernel(1, 1, 1);
    vgpu_graph_set_node(e, (CUgraphNode)unknown, 50);
    vgpu_graph_set_node(e, (CUgraphNode)unknown, 60);
    check(vgpu_graph_cost(e) == 1087,
          "a node unknown at instantiation set twice is counted once, at its last cost: 1087 "
          "(%llu)", cost(e));

    vgpu_graph_enable_node(e, (CUgraphNode)k20, 0);
    check(vgpu_graph_cost(e) == 1067, "a disabled node costs nothing: 1067 (%llu)",
          cost(e));
    vgpu_graph_enable_node(e, (CUgraphNode)k20, 0);
    vgpu_graph_set_node(e, (CUgraphNode)k20, 30);
    check(vgpu_graph_cost(e) == 1067, "disabled twice, then set while disabled: still 1067");
    vgpu_graph_enable_node(e, (CUgraphNode)k20, 1);
    check(vgpu_graph_cost(e) == 1097, "enabled again, at the cost set meanwhile: 1097 (%llu)",
          cost(e));
    vgpu_graph_enable_node(e, (CUgraphNode)copy, 0);
    check(vgpu_graph_cost(e) == 1097, "disabling a node that costs nothing changes nothing");

    struct tgraph small = {0};
    add(&small, kernel(3, 1, 1));
    rc = instantiate(e, &small);
    check(rc == 0 && vgpu_graph_cost(e) == 3,
          "updated to another graph: its cost replaces the old one (%llu)",
          cost(e));
    uint64_t serial = vgpu_graph_serial(e);
    check(serial != 0, "recorded under a serial (%llu)", (unsigned long long)serial);
    rc = instantiate(e, &small); /* the driver handed e's address to a new graph meanwhile */
    check(rc == 0 && vgpu_graph_forget(e, serial) == -1 && vgpu_graph_cost(e) == 3,
          "the old recording's removal, after the driver destroyed it, leaves a new graph at "
          "the same address alone");
    check(vgpu_graph_forget(e, vgpu_graph_serial(e)) == 0 && vgpu_graph_cost(e) == 1 &&
              vgpu_graph_serial(e) == 0 && vgpu_graph_forget(e, serial) == -1,
          "removed once destroyed: an unknown exec costs one token, and has no serial");
    vgpu_graph_set_node(e, (CUgraphNode)k10, 1000);
    vgpu_graph_enable_node(e, (CUgraphNode)k10, 1);
    check(vgpu_graph_cost(e) == 1, "setters on an exec the table does not know change nothing");
}

static void odd_graphs(void)
{
    const uint64_t max_node = UINT64_C(1) << 40;
    struct tgraph huge = {0};
    add(&huge, kernel(2147483647u, 65535, 65535));
    add(&huge, kernel(2147483647u, 65535, 65535));
    add(&huge, kernel(2147483647u, 65535, 65535));
    add(&huge, kernel(2147483647u, 65535, 65535));
    CUgraphExec e = exec_at(2);
    int rc = instantiate(e, &huge);
    check(rc == 0 && vgpu_graph_cost(e) == 4 * max_node,
          "four kernels of 2^63 blocks cost 4 x 2^40, not a sum wrapped round (%llu)",
          cost(e));
    vgpu_graph_set_node(e, (CUgraphNode)huge.nodes[0], UINT64_MAX);
    check(vgpu_graph_cost(e) == 4 * max_node, "a setter's cost is clamped the same way");
    /* 2^23 nodes of 2^40 blocks make 2^63, one past INT64_MAX (the limiter's tokens are
     * signed): the sum stops there; one node fewer is summed exactly. As a child graph, it is one
     * node, clamped. */
    struct tgraph many_huge = {.repeat = (size_t)1 << 23}, outer = {0};
    add(&many_huge, kernel(2147483647u, 65535, 65535));
    add(&outer, child(&many_huge));
    add(&outer, kernel(1, 1, 1));
    rc = instantiate(e, &many_huge);
    check(rc == 0 && vgpu_graph_cost(e) == INT64_MAX,
          "2^23 nodes of 2^40 blocks: the sum stops at INT64_MAX (%llu)", cost(e));
    many_huge.repeat--;
    rc = instantiate(e, &many_huge);
    check(rc == 0 && vgpu_graph_cost(e) == (((uint64_t)1 << 23) - 1) * max_node,
          "one node fewer: summed exactly (%llu)", cost(e));
    many_huge.repeat++;
    uint64_t sum = 0;
    rc = vgpu_graph_child_blocks(&api, handle(&many_huge), &sum);
    int child_rc = instantiate(e, &outer);
    check(rc == 0 && sum == max_node && child_rc == 0 && vgpu_graph_cost(e) == max_node + 1,
          "as a child graph, its node costs 2^40 like any other (%llu)", (unsigned long long)sum);

    struct tgraph unreadable = {0};
    struct tnode *hidden = kernel(100, 1, 1);
    hidden->unreadable = 1;
    add(&unreadable, hidden);
    add(&unreadable, kernel(10, 1, 1));
    rc = instantiate(e, &unreadable);
    check(rc == 0 && vgpu_graph_cost(e) == 10,
          "a kernel whose parameters cannot be read costs nothing yet: 10 (%llu)",
          cost(e));
    vgpu_graph_set_node(e, (CUgraphNode)hidden, 100);
    check(vgpu_graph_cost(e) == 110, "... and its cost once a setter gives it: 110");

    struct tgraph failing = {.fails = 1};
    add(&failing, kernel(100, 1, 1));
    check(instantiate(e, &failing) == 0 && vgpu_graph_cost(e) == 1,
          "a graph whose nodes cannot be listed costs one token");
    struct tgraph shrinking = {.shrink = 1};
    add(&shrinking, kernel(100, 1, 1));
    add(&shrinking, kernel(200, 1, 1));
    rc = instantiate(e, &shrinking);
    check(rc == 0 && vgpu_graph_cost(e) == 100,
          "nodes removed between counting and listing are not read: 100 (%llu)",
          cost(e));
    struct vgpu_graph_api older = api;
    older.kernel_params = NULL;
    older.kernel_params_v1 = kernel_params_v1;
    shrinking.shrink = 0;
    rc = instantiate(e, &shrinking);
    check(rc == 0 && vgpu_graph_cost(e) == 300, "over CUDA 12's kernel parameters: 300 (%llu)",
          cost(e));
    struct vgpu_graph_costs costs;
    rc = vgpu_graph_costs(&older, handle(&shrinking), &costs);
    rc |= vgpu_graph_remember(e, &costs);
    check(rc == 0 && vgpu_graph_cost(e) == 300,
          "over a CUDA 11 driver's (CUDA 10 ABI) alone: the same 300 (%llu)", cost(e));
    struct vgpu_graph_api blind = older;
    blind.kernel_params_v1 = NULL;
    uint64_t blocks = 1;
    check(vgpu_graph_costs(&blind, handle(&shrinking), &costs) == 0 && costs.count == 0 &&
              vgpu_graph_child_blocks(&blind, handle(&shrinking), &blocks) == 0 && blocks == 0,
          "without the driver's inspection functions nothing is learnt");

    struct tgraph empty = {0};
    rc = instantiate(e, &empty);
    check(rc == 0 && vgpu_graph_cost(e) == 1, "an empty graph costs one token");
    vgpu_graph_set_node(e, (CUgraphNode)hidden, 40);
    check(vgpu_graph_cost(e) == 40, "a node set in it (no node list to search): 40");
    vgpu_graph_enable_node(e, (CUgraphNode)hidden, 0);
    check(vgpu_graph_cost(e) == 1, "that node disabled: one token again");

    /* Nested ten deep, a kernel of one block at each level: the levels below the top down to 8
     * are read (8 blocks); what is nested deeper is charged as unread work (2^10 blocks:
     * charged nothing, a WHILE loop down there ran unthrottled, helper review). */
    static struct tgraph levels[10];
    for (int i = 9; i >= 0; i--) {
        levels[i] = (struct tgraph){0};
        add(&levels[i], kernel(1, 1, 1));
        if (i < 9)
            add(&levels[i], child(&levels[i + 1]));
    }
    struct tgraph top = {0};
    add(&top, child(&levels[0]));
    rc = instantiate(e, &top);
    check(rc == 0 && vgpu_graph_cost(e) == 8 + 1024,
          "child graphs are read down to 8 levels below the top, deeper ones charged 1024 "
          "blocks: %llu", cost(e));
    rc = vgpu_graph_child_blocks(&api, handle(&levels[0]), &blocks);
    check(rc == 0 && blocks == 8 + 1024, "a child graph set by a setter counts the same: %llu",
          (unsigned long long)blocks);
    /* A conditional node (type 13, CUDA 12.3): its body cannot be read, a WHILE's runs any
     * number of times. */
    struct tgraph cond = {0};
    add(&cond, kernel(5, 1, 1));
    for (int i = 0; i < 10; i++)
        add(&cond, other((CUgraphNodeType)13));
    rc = instantiate(e, &cond);
    check(rc == 0 && vgpu_graph_cost(e) == 5 + 1024,
          "ten conditional nodes are charged 1024 blocks once (charged nothing, a WHILE ran "
          "unthrottled; 1024 each, a graph of many trivial ones stalled its process): %llu",
          cost(e));
    forget(e);
}

/* cuGraphExecUpdate: the executable takes the update graph's costs, but its setters go on
 * naming the nodes of the graph it was instantiated from (the driver's rule), paired by place. */
static void updates(void)
{
    struct tgraph inner = {0}, first = {0}, inner2 = {0}, second = {0};
    add(&inner, kernel(5, 1, 1));
    add(&inner2, kernel(50, 1, 1));
    struct tnode *a0 = kernel(10, 1, 1), *a1 = kernel(20, 1, 1), *a2 = child(&inner);
    add(&first, a0);
    add(&first, other(CU_GRAPH_NODE_TYPE_MEMCPY));
    add(&first, a1);
    add(&first, a2);
    struct tnode *b0 = kernel(100, 1, 1);
    add(&second, b0);
    add(&second, other(CU_GRAPH_NODE_TYPE_MEMCPY));
    add(&second, kernel(200, 1, 1));
    add(&second, child(&inner2));
    CUgraphExec e = exec_at(5);
    check(instantiate(e, &first) == 0 && vgpu_graph_cost(e) == 35, "instantiated: 35 blocks");
    vgpu_graph_set_node(e, (CUgraphNode)kernel(1, 1, 1), 7); /* unknown at instantiation */
    struct vgpu_graph_costs costs;
    int rc = vgpu_graph_costs(&api, handle(&second), &costs);
    rc |= vgpu_graph_update(e, &costs);
    check(rc == 0 && costs.nodes == NULL && vgpu_graph_cost(e) == 350,
          "updated to a graph of the same topology: its 350 blocks (%llu)", cost(e));
    vgpu_graph_set_node(e, (CUgraphNode)a0, 1000);
    check(vgpu_graph_cost(e) == 1250,
          "a setter naming the first graph's node changes that node: 1250, not 1350 (%llu)",
          cost(e));
    vgpu_graph_enable_node(e, (CUgraphNode)a1, 0);
    vgpu_graph_set_node(e, (CUgraphNode)a2, 8);
    check(vgpu_graph_cost(e) == 1008,
          "... and disabling one, replacing its child graph: 1008 (%llu)", cost(e));
    CUgraphExec unknown = exec_at(6);
    rc = vgpu_graph_costs(&api, handle(&second), &costs);
    rc |= vgpu_graph_update(unknown, &costs);
    vgpu_graph_set_node(unknown, (CUgraphNode)b0, 1);
    check(rc == 0 && vgpu_graph_cost(unknown) == 251,
          "an update of an executable not seen before is remembered under its own nodes: 251 "
          "(%llu)", cost(unknown));
    forget(e);
    forget(unknown);
}

/* More executable graphs than the old fixed table of 4096 held (its 4097th cost one token). */
static void many(void)
{
    struct tgraph g = {0};
    add(&g, kernel(1, 1, 1));
    enum { COUNT = 10000 };
    int right = 1;
    for (size_t i = 0; i < COUNT; i++) {
        g.nodes[0]->grid[0] = (unsigned)i + 2;
        right &= instantiate(exec_at(i), &g) == 0;
    }
    for (size_t i = 0; i < COUNT; i++)
        right &= vgpu_graph_cost(exec_at(i)) == i + 2;
    check(right, "%d executable graphs each keep their own cost", COUNT);
    for (size_t i = 0; i < COUNT; i += 2)
        forget(exec_at(i));
    right = 1;
    for (size_t i = 0; i < COUNT; i++)
        right &= vgpu_graph_cost(exec_at(i)) == (i % 2 ? i + 2 : 1);
    for (int round = 0; round < 20; round++)
        for (size_t i = 0; i < COUNT; i += 2) {
            g.nodes[0]->grid[0] = 7;
            right &= instantiate(exec_at(i), &g) == 0;
            forget(exec_at(i));
        }
    for (size_t i = 0; i < COUNT; i++)
        right &= vgpu_graph_cost(exec_at(i)) == (i % 2 ? i + 2 : 1);
    check(right, "half destroyed, then 20 rounds of instantiate and destroy: the rest keep "
                 "their costs, the destroyed cost one token");
    for (size_t i = 1; i < COUNT; i += 2)
        forget(exec_at(i));
}

static void out_of_memory(void)
{
    struct tgraph g = {0};
    add(&g, kernel(10, 1, 1));
    struct vgpu_graph_costs costs;
    fail_in = 1;
    check(vgpu_graph_costs(&api, handle(&g), &costs) == -1 && costs.nodes == NULL,
          "no memory for the node list: -1, nothing kept");
    fail_in = 2;
    check(vgpu_graph_costs(&api, handle(&g), &costs) == -1 && costs.nodes == NULL,
          "no memory for the costs: -1, nothing kept");
    struct tgraph inner = {0}, outer = {0};
    add(&inner, kernel(20, 1, 1));
    add(&outer, kernel(10, 1, 1));
    add(&outer, child(&inner));
    fail_in = 3; /* the outer list, its costs, then the child graph's list */
    check(vgpu_graph_costs(&api, handle(&outer), &costs) == -1 && costs.nodes == NULL,
          "no memory for a child graph's node list: -1, nothing kept (it would cost nothing)");
    uint64_t blocks = 1;
    fail_in = 1;
    check(vgpu_graph_child_blocks(&api, handle(&inner), &blocks) == -1,
          "the same for a child graph a setter gives");
    fail_in = 0;

    /* The table's first allocation (it has none yet) fails: the costs are freed and -1 returned. */
    check(vgpu_graph_costs(&api, handle(&g), &costs) == 0, "costs read");
    fail_in = 1;
    check(vgpu_graph_remember(exec_at(3), &costs) == -1 && costs.nodes == NULL &&
              vgpu_graph_cost(exec_at(3)) == 1,
          "no memory for the table: -1, the exec unknown (the wrapper destroys it)");

    check(instantiate(exec_at(3), &g) == 0 && vgpu_graph_cost(exec_at(3)) == 10, "remembered");
    fail_in = 1;
    vgpu_graph_set_node(exec_at(3), (CUgraphNode)kernel(1, 1, 1), 500);
    check(vgpu_graph_cost(exec_at(3)) == 510,
          "no memory to add an unknown node: its cost is charged all the same (%llu)",
          cost(exec_at(3)));
    forget(exec_at(3));
}

/* The child of a fork made while the table's lock was held, half-way through a rehash: its
 * table is empty (the parent's executable graphs are not its own) and its lock free. Exits 0
 * when both hold; a lock left held would hang it until the alarm. */
static CUgraphExec parents_exec;

static void child_after_fork(void)
{
    alarm(10);
    struct tgraph g = {0};
    add(&g, kernel(10, 1, 1));
    int unknown = vgpu_graph_cost(parents_exec) == 1;
    int usable = instantiate(exec_at(19999), &g) == 0 && vgpu_graph_cost(exec_at(19999)) == 10;
    _exit(unknown && usable ? 0 : 1 + !unknown);
}

static void fork_while_locked(void)
{
    struct tgraph g = {0};
    add(&g, kernel(7, 1, 1));
    parents_exec = exec_at(0);
    int kept = instantiate(parents_exec, &g) == 0;
    fork_child = child_after_fork;
    /* New executable graphs until one makes the table grow: the only calloc of a remember is
     * the rehash's, made holding the lock. */
    size_t i = 1;
    for (; forked_status == -1 && i < 1000; i++) {
        struct vgpu_graph_costs costs;
        kept &= vgpu_graph_costs(&api, handle(&g), &costs) == 0;
        fork_in = 1;
        kept &= vgpu_graph_remember(exec_at(i), &costs) == 0;
        fork_in = 0;
    }
    check(WIFEXITED(forked_status) && WEXITSTATUS(forked_status) == 0,
          "a fork while the table's lock is held mid-rehash: the child's table is empty and "
          "usable (wait status %d)", forked_status);
    for (size_t j = 0; j < i; j++)
        kept &= vgpu_graph_cost(exec_at(j)) == 7;
    check(kept, "... and the parent's %zu executable graphs keep their cost", i);
    for (size_t j = 0; j < i; j++)
        forget(exec_at(j));
}

/* What the allocation nodes of g take on device 0 and 1 once remembered for e (-1, -1 when g
 * cannot be read, 0, 0 when it allocates nothing). */
static void memory_of(CUgraphExec e, struct tgraph *g, long long *dev0, long long *dev1)
{
    struct vgpu_graph_costs costs = {0};
    struct vgpu_graph_memory m;
    *dev0 = *dev1 = -1;
    if (vgpu_graph_memory_read(&api, handle(g), &costs) != 0)
        return;
    int none = costs.memory == NULL;
    vgpu_graph_remember(e, &costs);
    *dev0 = *dev1 = 0;
    if (!none && vgpu_graph_memory_of(e, &m)) {
        *dev0 = (long long)m.bytes[0];
        *dev1 = (long long)m.bytes[1];
    }
}

static void memory_nodes(void)
{
    CUgraphExec e = exec_at(7);
    long long d0, d1;
    struct tgraph inner = {0}, g = {0};
    add(&inner, allocation(50, 1));
    add(&inner, allocation(25, 0));
    add(&g, kernel(10, 1, 1));
    add(&g, allocation(100, 0));
    add(&g, child(&inner));
    memory_of(e, &g, &d0, &d1);
    check(d0 == 125 && d1 == 50, "allocation nodes summed per device, child graphs included: "
          "%lld on device 0, %lld on device 1", d0, d1);
    struct tgraph plain = {0};
    add(&plain, kernel(10, 1, 1));
    memory_of(exec_at(8), &plain, &d0, &d1);
    struct vgpu_graph_memory m;
    check(d0 == 0 && d1 == 0 && !vgpu_graph_memory_of(exec_at(8), &m),
          "a graph without allocation nodes takes nothing, and its exec says so");

    struct tgraph smaller = {0}, larger = {0};
    add(&smaller, allocation(10, 0));
    add(&smaller, allocation(90, 1));
    struct vgpu_graph_costs costs = {0};
    int rc = vgpu_graph_memory_read(&api, handle(&smaller), &costs);
    rc |= vgpu_graph_update(e, &costs);
    rc |= !vgpu_graph_memory_of(e, &m);
    check(rc == 0 && m.bytes[0] == 125 && m.bytes[1] == 90,
          "updated to a graph that takes less on device 0 and more on device 1: the larger of "
          "each (%llu, %llu)", (unsigned long long)m.bytes[0], (unsigned long long)m.bytes[1]);
    add(&larger, allocation(UINT64_MAX, 0));
    add(&larger, allocation(5, 0));
    rc = vgpu_graph_memory_read(&api, handle(&larger), &costs);
    rc |= vgpu_graph_update(e, &costs);
    rc |= !vgpu_graph_memory_of(e, &m);
    check(rc == 0 && m.bytes[0] == INT64_MAX,
          "sizes that would wrap a 64-bit sum stop at INT64_MAX (%llu)",
          (unsigned long long)m.bytes[0]);
    check(vgpu_graph_forget(e, vgpu_graph_serial(e)) == 0 && !vgpu_graph_memory_of(e, &m),
          "removed from the table: the exec takes nothing known");

    struct tgraph hidden = {0}, elsewhere = {0}, deep[66];
    struct tnode *unread = allocation(10, 0);
    unread->unreadable = 1;
    add(&hidden, unread);
    memory_of(e, &hidden, &d0, &d1);
    check(d0 == -1, "an allocation node whose parameters cannot be read: -1 (refused)");
    add(&elsewhere, allocation(10, VGPU_GRAPH_DEVICES));
    memory_of(e, &elsewhere, &d0, &d1);
    check(d0 == -1, "one on a device past the %d told apart: -1", VGPU_GRAPH_DEVICES);
    struct vgpu_graph_api older = api;
    older.alloc_params = NULL;
    add(&plain, allocation(10, 0));
    check(vgpu_graph_memory_read(&older, handle(&plain), &costs) == -1,
          "one on a driver that cannot describe them: -1");
    memset(deep, 0, sizeof deep);
    for (int i = 0; i < 65; i++)
        add(&deep[i], child(&deep[i + 1]));
    add(&deep[65], allocation(10, 0));
    memory_of(e, &deep[0], &d0, &d1);
    check(d0 == -1, "one nested 65 child graphs deep: -1");
    memory_of(e, &deep[1], &d0, &d1);
    check(d0 == 10, "64 deep: counted (%lld)", d0);
    fail_in = 1;
    check(vgpu_graph_memory_read(&api, handle(&g), &costs) == -1 && costs.memory == NULL,
          "no host memory to list the nodes: -1, nothing kept");
    fail_in = 3; /* the top list, the child's list, then the record */
    check(vgpu_graph_memory_read(&api, handle(&g), &costs) == -1 && costs.memory == NULL &&
              fail_in == 0,
          "no host memory for the record: -1, nothing kept");
    fail_in = 0;
    check(vgpu_graph_forget(e, vgpu_graph_serial(e)) == 0, "cleaned up");

    /* The most local memory a thread of its kernels needs (the driver raises the stack). */
    struct vgpu_graph_api asking = api;
    asking.local_bytes = kernel_local;
    struct tgraph stacked = {0}, nested = {0}, light = {0};
    struct tnode *small = kernel(1, 1, 1), *big = kernel(1, 1, 1);
    small->bytes = 2048;
    big->bytes = 4096;
    add(&nested, big);
    add(&stacked, small);
    add(&stacked, child(&nested));
    add(&light, kernel(1, 1, 1));
    int read = vgpu_graph_memory_read(&asking, handle(&stacked), &costs);
    check(read == 0 && costs.memory != NULL && costs.memory->stack == 4096 &&
              costs.memory->bytes[0] == 0,
          "kernels needing 2 and 4 KiB a thread, one in a child graph: the graph needs 4096 "
          "bytes of stack, and allocates nothing");
    vgpu_graph_costs_free(&costs);
    check(vgpu_graph_memory_read(&asking, handle(&light), &costs) == 0 && costs.memory == NULL,
          "kernels needing no local memory: nothing to record");
}

/* A memset node is work as a kernel is (the driver runs it as one): it costs what the memset
 * exports are charged for what it sets, a block a 4 KiB (src/cuda_memset.c). Before, memset
 * nodes were left out, and a graph of them cost one token a launch. */
static void memset_nodes(void)
{
    struct tgraph g = {0};
    struct tnode *set = other(CU_GRAPH_NODE_TYPE_MEMSET), *unread = other(CU_GRAPH_NODE_TYPE_MEMSET);
    set->bytes = 6 * 1024; /* 4-byte elements: 24 KiB, 6 blocks */
    unread->unreadable = 1;
    add(&g, kernel(10, 1, 1));
    add(&g, set);
    add(&g, unread);
    CUgraphExec e = exec_at(19000);
    int rc = instantiate(e, &g);
    check(rc == 0 && cost(e) == 17, "a kernel of 10 blocks, a memset of 24 KiB "
          "and one whose parameters cannot be read cost 10 + 6 + 1: %llu", cost(e));
    CUDA_MEMSET_NODE_PARAMS bigger = {.elementSize = 2, .width = 4096, .height = 8};
    vgpu_graph_set_node(e, (CUgraphNode)set, vgpu_graph_memset_blocks(&bigger));
    check(cost(e) == 27, "the memset set to 8 rows of 8 KiB: 10 + 16 + 1 (%llu)", cost(e));
    CUDA_MEMSET_NODE_PARAMS huge = {.elementSize = 4, .width = SIZE_MAX / 2, .height = 8};
    check(vgpu_graph_memset_blocks(&huge) == UINT64_MAX / 4096 + 1, "a size past 64 bits "
          "saturates (%llu blocks)", (unsigned long long)vgpu_graph_memset_blocks(&huge));
    forget(e);
}

/* A signal handler's launch while its thread changes the table (a storm of SIGPROF every tick
 * for 2 s over a loop that disables and enables a node): its lookup does not wait for the
 * thread's own lock; it gets the graph's cost, or that of a graph that cannot be read when it
 * landed inside the lock (a plain lock waited for ever there: the watchdog ends the test). */
static CUgraphExec storm_exec;
static volatile sig_atomic_t storm_known, storm_unread, storm_other;

static void storm_lookup(int sig)
{
    (void)sig;
    uint64_t blocks = vgpu_graph_cost(storm_exec);
    if (blocks == 1024)
        storm_unread = storm_unread + 1;
    else if (blocks == 30 || blocks == 10)
        storm_known = storm_known + 1;
    else
        storm_other = storm_other + 1;
}

static struct tnode *storm_node;

static void toggle_node(unsigned long round)
{
    (void)round;
    vgpu_graph_enable_node(storm_exec, (CUgraphNode)storm_node, 0);
    vgpu_graph_enable_node(storm_exec, (CUgraphNode)storm_node, 1);
}

static void lookup_from_handler(void)
{
    struct tgraph g = {0};
    struct tnode *k10 = kernel(10, 1, 1), *k20 = kernel(20, 1, 1);
    add(&g, k10);
    add(&g, k20);
    storm_exec = exec_at(2);
    if (!check(instantiate(storm_exec, &g) == 0 && vgpu_graph_cost(storm_exec) == 30,
               "a graph of 30 blocks"))
        return;
    storm_node = k20;
    unsigned long rounds = storm(2.0, storm_lookup, toggle_node,
                                 "FAIL - a lookup from a signal handler waited for its own "
                                 "thread's lock of the table\n");
    check(storm_unread > 0 && storm_known > 0 && storm_other == 0,
          "lookups from a signal handler over %lu rounds of a node disabled and enabled: %d "
          "inside the thread's lock cost an unreadable graph's 1024 blocks, %d the graph's own; "
          "none waited for ever", rounds, (int)storm_unread, (int)storm_known);
    forget(storm_exec);
}

int main(void)
{
    out_of_memory(); /* first: the table's first allocation is tested there */
    setters();
    updates();
    odd_graphs();
    fork_while_locked(); /* before many(): the table is small, so it soon grows */
    many();
    memory_nodes();
    memset_nodes();
    lookup_from_handler();
    return check_done("test_graphs");
}
