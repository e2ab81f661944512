/* graphs.c - the cost of CUDA graph launches for the SM limiter. A graph replays many kernels
 * with one call; counted as one token it ran at 31 % under a 25 % limit on an H100. The cost
 * is kept per top-level node: a graph instantiated with one-block kernels and then set to
 * 2000-block ones (cuGraphExecKernelNodeSetParams) must cost 2000 blocks a kernel, or it runs
 * unthrottled. Executable graphs live in an open-addressing table that grows: a full table
 * would let the next graph run at one token. */
#ifndef _GNU_SOURCE /* the unit test defines it on the command line */
#define _GNU_SOURCE
#endif
#include "graphs.h"
#include "locks.h"
#include "throttle.h"
#include "util.h"

#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

enum {
    MAX_DEPTH = 8,         /* child graphs nested deeper than this are not read */
    MAX_MEMORY_DEPTH = 64, /* for memory, deeper ones refuse the graph */
    FIRST_CAPACITY = 64, /* table slots at the first remembered graph; a power of two */
};
/* One node's cost is clamped here (a kernel of 2^40 blocks runs for minutes), so that the sum
 * of a graph's nodes cannot wrap round to a small number; sums stop at INT64_MAX (the limiter's
 * token count is signed). */
static const uint64_t max_node_blocks = UINT64_C(1) << 40;
static const uint64_t max_total = INT64_MAX;

struct entry {
    CUgraphExec exec; /* NULL: never used; tombstone: removed */
    uint64_t serial;  /* which recording of exec (a destroyed graph's address comes back) */
    uint64_t total;   /* the enabled nodes' blocks, saturating */
    struct vgpu_graph_costs costs;
};

static struct graph_table {
    struct entry *slots;
    size_t capacity, used; /* used: live entries and tombstones */
} table;
static size_t allocating; /* atomic: live entries with memory (none: launches skip the table) */
static uint64_t last_serial; /* under table_lock */
static pthread_mutex_t table_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;
static char tombstone_byte;
static const CUgraphExec tombstone = (CUgraphExec)(void *)&tombstone_byte;

static uint64_t add(uint64_t a, uint64_t b)
{
    return a > max_total || b > max_total - a ? max_total : a + b;
}

static uint64_t clamp(uint64_t blocks) { return blocks < max_node_blocks ? blocks : max_node_blocks; }

/* ---- reading a graph ------------------------------------------------------------------------ */

static int readable(const struct vgpu_graph_api *api)
{
    return api->get_nodes != NULL && api->node_type != NULL &&
           (api->kernel_params != NULL || api->kernel_params_v1 != NULL) &&
           api->child_graph != NULL;
}

/* A kernel node's parameters, through the CUDA 12 call or else the CUDA 10 one, whose struct is
 * the start of the CUDA 12 one (kern and ctx left NULL); -1 when they cannot be read. */
static int kernel_node(const struct vgpu_graph_api *api, CUgraphNode node, CUDA_KERNEL_NODE_PARAMS *p)
{
    _Static_assert(offsetof(CUDA_KERNEL_NODE_PARAMS, extra) ==
                       offsetof(CUDA_KERNEL_NODE_PARAMS_v1, extra),
                   "CUDA 10's kernel node parameters are the start of CUDA 12's");
    memset(p, 0, sizeof *p);
    if (api->kernel_params != NULL)
        return api->kernel_params(node, p) == CUDA_SUCCESS ? 0 : -1;
    CUDA_KERNEL_NODE_PARAMS_v1 v1;
    if (api->kernel_params_v1 == NULL || api->kernel_params_v1(node, &v1) != CUDA_SUCCESS)
        return -1;
    memcpy(p, &v1, sizeof v1);
    return 0;
}

/* A kernel node's grid blocks (0 when they cannot be read). */
static uint64_t kernel_blocks(const struct vgpu_graph_api *api, CUgraphNode node)
{
    CUDA_KERNEL_NODE_PARAMS p;
    return kernel_node(api, node, &p) == 0 ? (uint64_t)p.gridDimX * p.gridDimY * p.gridDimZ : 0;
}

/* A kernel node's function, or its CUkernel where it names none (cast, as launches take it);
 * NULL when it cannot be read. */
static CUfunction kernel_function(const struct vgpu_graph_api *api, CUgraphNode node)
{
    CUDA_KERNEL_NODE_PARAMS p;
    if (kernel_node(api, node, &p) != 0)
        return NULL;
    return p.func != NULL ? p.func : (CUfunction)(void *)p.kern;
}

/* The graph's nodes (*count of them, calloc'ed; the caller frees); NULL with *count 0 when it
 * has none or cannot be read, NULL with *count != 0 when out of memory. */
static CUgraphNode *nodes_of(const struct vgpu_graph_api *api, CUgraph graph, size_t *count)
{
    *count = 0;
    size_t asked = 0;
    if (api->get_nodes(graph, NULL, &asked) != CUDA_SUCCESS || asked == 0)
        return NULL;
    CUgraphNode *nodes = calloc(asked, sizeof *nodes);
    if (nodes == NULL) {
        *count = asked;
        return NULL;
    }
    size_t got = asked;
    if (api->get_nodes(graph, nodes, &got) != CUDA_SUCCESS) {
        free(nodes);
        return NULL;
    }
    *count = got < asked ? got : asked; /* the driver writes at most what it was given room for */
    return nodes;
}

static int blocks_of(const struct vgpu_graph_api *api, CUgraph graph, int depth, uint64_t *total,
                     int *unread);

/* Work the limiter cannot read: a conditional node (CU_GRAPH_NODE_TYPE_CONDITIONAL, 13 in cuda.h
 * from CUDA 12.3), whose body cuda.h 12 gives no way to read and whose WHILE body runs any number
 * of times a launch, and child graphs nested past MAX_DEPTH. Charged nothing (one token a
 * launch), such a graph could launch at least once a second, the limiter's least rate, and keep
 * the GPU busy all that second. A graph with any is charged this many blocks more, once however
 * many it has (about a millisecond of work): the limiter's feedback, which measures what the
 * container really used, then sets how often it may launch, down to once in 17 minutes. A
 * larger charge (2^20 was tried, or 2^10 a node with 1024 nodes) left a process that had
 * launched little waiting 42 s behind one trivial graph, since its rate is kept while it waits
 * (throttle.c). *unread says whether the walk charged it already. */
enum { NODE_TYPE_CONDITIONAL = 13 };
static const uint64_t unread_blocks = UINT64_C(1) << 10;

uint64_t vgpu_graph_memset_blocks(const CUDA_MEMSET_NODE_PARAMS *p)
{
    return vgpu_memset_blocks(
        mul_saturated(p->elementSize, mul_saturated(p->width, p->height)));
}

/* What a memset node costs; one that cannot be read costs a block, as a launch the driver
 * takes with no grid does. */
static uint64_t memset_node_blocks(const struct vgpu_graph_api *api, CUgraphNode node)
{
    CUDA_MEMSET_NODE_PARAMS p;
    if (api->memset_params == NULL || api->memset_params(node, &p) != CUDA_SUCCESS)
        return 1;
    return vgpu_graph_memset_blocks(&p);
}

/* What one node costs (*blocks; 0 for a node that runs no kernel). *costly: a kernel, memset or
 * child graph node (one a setter may change). -1: out of host memory in a child graph. */
static int node_blocks(const struct vgpu_graph_api *api, CUgraphNode node, int depth,
                       uint64_t *blocks, int *costly, int *unread)
{
    CUgraphNodeType type;
    CUgraph child;
    *blocks = 0;
    *costly = 0;
    if (api->node_type(node, &type) != CUDA_SUCCESS)
        return 0;
    if (type == CU_GRAPH_NODE_TYPE_KERNEL) {
        *costly = 1;
        *blocks = clamp(kernel_blocks(api, node));
        return 0;
    }
    if (type == CU_GRAPH_NODE_TYPE_MEMSET) {
        *costly = 1;
        *blocks = clamp(memset_node_blocks(api, node));
        return 0;
    }
    if (type == CU_GRAPH_NODE_TYPE_GRAPH) {
        *costly = 1;
        if (api->child_graph(node, &child) == CUDA_SUCCESS &&
            blocks_of(api, child, depth + 1, blocks, unread) != 0)
            return -1;
        *blocks = clamp(*blocks);
    }
    if ((int)type == NODE_TYPE_CONDITIONAL) {
        *costly = 1;
        *blocks = *unread ? 0 : unread_blocks;
        *unread = 1;
    }
    return 0;
}

/* Adds the blocks of graph's kernel nodes, child graphs included, to *total. -1: out of host
 * memory (a child graph costing nothing for it would run unthrottled). */
static int blocks_of(const struct vgpu_graph_api *api, CUgraph graph, int depth, uint64_t *total,
                     int *unread)
{
    size_t count;
    if (depth > MAX_DEPTH) {
        *total = add(*total, *unread ? 0 : unread_blocks);
        *unread = 1;
        return 0;
    }
    CUgraphNode *nodes = nodes_of(api, graph, &count);
    if (nodes == NULL)
        return count != 0 ? -1 : 0;
    int rc = 0;
    for (size_t i = 0; i < count && rc == 0; i++) {
        uint64_t blocks;
        int costly;
        rc = node_blocks(api, nodes[i], depth, &blocks, &costly, unread);
        *total = add(*total, blocks);
    }
    free(nodes);
    return rc;
}

int vgpu_graph_child_blocks(const struct vgpu_graph_api *api, CUgraph graph, uint64_t *blocks)
{
    *blocks = 0;
    if (!readable(api) || graph == NULL)
        return 0;
    int unread = 0;
    int rc = blocks_of(api, graph, 1, blocks, &unread); /* a child graph sits one level down */
    *blocks = clamp(*blocks);
    return rc;
}

/* Adds what graph's allocation nodes take, child graphs included, to *m. -1: cannot be told. */
static int memory_of(const struct vgpu_graph_api *api, CUgraph graph, int depth,
                     struct vgpu_graph_memory *m)
{
    size_t count;
    if (depth > MAX_MEMORY_DEPTH)
        return -1;
    CUgraphNode *nodes = nodes_of(api, graph, &count);
    if (nodes == NULL)
        return count != 0 ? -1 : 0;
    int rc = 0;
    for (size_t i = 0; i < count && rc == 0; i++) {
        CUgraphNodeType type;
        CUgraph child;
        CUDA_MEM_ALLOC_NODE_PARAMS p;
        if (api->node_type(nodes[i], &type) != CUDA_SUCCESS)
            continue;
        if (type == CU_GRAPH_NODE_TYPE_GRAPH && api->child_graph(nodes[i], &child) == CUDA_SUCCESS)
            rc = memory_of(api, child, depth + 1, m);
        if (type == CU_GRAPH_NODE_TYPE_KERNEL && api->local_bytes != NULL) {
            uint64_t local = api->local_bytes(kernel_function(api, nodes[i]));
            m->stack = local > m->stack ? local : m->stack;
        }
        if (type != CU_GRAPH_NODE_TYPE_MEM_ALLOC)
            continue;
        /* Graph allocations live on a device (cuda.h: the pool's location); anything else is
         * a node this library cannot account for. */
        if (api->alloc_params == NULL || api->alloc_params(nodes[i], &p) != CUDA_SUCCESS ||
            p.poolProps.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
            p.poolProps.location.id < 0 || p.poolProps.location.id >= VGPU_GRAPH_DEVICES)
            rc = -1;
        else
            m->bytes[p.poolProps.location.id] = add(m->bytes[p.poolProps.location.id], p.bytesize);
    }
    free(nodes);
    return rc;
}

int vgpu_graph_memory_read(const struct vgpu_graph_api *api, CUgraph graph,
                           struct vgpu_graph_costs *costs)
{
    costs->memory = NULL;
    if (api->get_nodes == NULL || api->node_type == NULL || api->child_graph == NULL ||
        graph == NULL)
        return 0;
    struct vgpu_graph_memory m = {{0}, 0};
    if (memory_of(api, graph, 0, &m) != 0)
        return -1;
    for (int d = 0; d <= VGPU_GRAPH_DEVICES; d++) {
        if (d < VGPU_GRAPH_DEVICES ? m.bytes[d] == 0 : m.stack == 0)
            continue;
        costs->memory = calloc(1, sizeof m);
        if (costs->memory == NULL)
            return -1;
        *costs->memory = m;
        break;
    }
    return 0;
}

void vgpu_graph_costs_free(struct vgpu_graph_costs *costs)
{
    free(costs->nodes);
    free(costs->memory);
    *costs = (struct vgpu_graph_costs){0};
}

static int by_node(const void *a, const void *b)
{
    uintptr_t x = (uintptr_t)((const struct vgpu_node_cost *)a)->node;
    uintptr_t y = (uintptr_t)((const struct vgpu_node_cost *)b)->node;
    return (x > y) - (x < y);
}

static int by_position(const void *a, const void *b)
{
    size_t x = ((const struct vgpu_node_cost *)a)->position;
    size_t y = ((const struct vgpu_node_cost *)b)->position;
    return (x > y) - (x < y);
}

int vgpu_graph_costs(const struct vgpu_graph_api *api, CUgraph graph,
                     struct vgpu_graph_costs *costs)
{
    *costs = (struct vgpu_graph_costs){0};
    if (!readable(api) || graph == NULL)
        return 0;
    size_t count;
    CUgraphNode *nodes = nodes_of(api, graph, &count);
    struct vgpu_node_cost *out = nodes != NULL ? calloc(count, sizeof *out) : NULL;
    if (out == NULL) {
        free(nodes);
        return count != 0 ? -1 : 0;
    }
    size_t kept = 0;
    int rc = 0, unread = 0;
    for (size_t i = 0; i < count && rc == 0; i++) {
        uint64_t blocks;
        int costly;
        rc = node_blocks(api, nodes[i], 0, &blocks, &costly, &unread);
        if (costly)
            out[kept++] = (struct vgpu_node_cost){.node = nodes[i], .blocks = blocks,
                                                  .position = i < UINT32_MAX ? (uint32_t)i
                                                                             : UINT32_MAX,
                                                  .enabled = 1};
    }
    free(nodes);
    if (rc != 0) {
        free(out);
        return -1;
    }
    qsort(out, kept, sizeof *out, by_node);
    costs->nodes = out;
    costs->count = kept;
    return 0;
}

/* ---- the table of executable graphs (caller holds table_lock) ------------------------------ */

static size_t home(CUgraphExec exec, size_t capacity)
{
    return (size_t)(((uintptr_t)exec * UINT64_C(0x9e3779b97f4a7c15)) >> 32) & (capacity - 1);
}

static struct entry *find(CUgraphExec exec)
{
    for (size_t n = 0, i = table.capacity ? home(exec, table.capacity) : 0;
         n < table.capacity && table.slots[i].exec != NULL;
         n++, i = (i + 1) & (table.capacity - 1))
        if (table.slots[i].exec == exec)
            return &table.slots[i];
    return NULL;
}

static uint64_t total_of(const struct vgpu_graph_costs *costs)
{
    uint64_t total = 0;
    for (size_t i = 0; i < costs->count; i++)
        if (costs->nodes[i].enabled)
            total = add(total, costs->nodes[i].blocks);
    return total;
}

/* Re-inserts the live entries into a table of `capacity` slots (tombstones dropped). */
static int rehash(size_t capacity)
{
    struct entry *slots = calloc(capacity, sizeof *slots);
    if (slots == NULL)
        return -1;
    size_t live = 0;
    for (size_t i = 0; i < table.capacity; i++) {
        struct entry *e = &table.slots[i];
        if (e->exec == NULL || e->exec == tombstone)
            continue;
        size_t j = home(e->exec, capacity);
        while (slots[j].exec != NULL)
            j = (j + 1) & (capacity - 1);
        slots[j] = *e;
        live++;
    }
    free(table.slots);
    table.slots = slots;
    table.capacity = capacity;
    table.used = live;
    return 0;
}

/* A slot for a new exec, the table grown (or cleared of tombstones) to stay at most half used;
 * NULL when out of memory. */
static struct entry *new_slot(CUgraphExec exec)
{
    if (2 * (table.used + 1) > table.capacity) {
        size_t live = 0;
        for (size_t i = 0; i < table.capacity; i++)
            live += table.slots[i].exec != NULL && table.slots[i].exec != tombstone;
        size_t capacity = table.capacity ? table.capacity : FIRST_CAPACITY;
        while (4 * (live + 1) > capacity)
            capacity *= 2;
        if (rehash(capacity) != 0)
            return NULL;
    }
    size_t i = home(exec, table.capacity);
    while (table.slots[i].exec != NULL && table.slots[i].exec != tombstone)
        i = (i + 1) & (table.capacity - 1);
    if (table.slots[i].exec == NULL)
        table.used++;
    return &table.slots[i];
}

/* A fork while another thread held the lock (perhaps half-way through a rehash) must not wedge
 * the child; the parent's executable graphs are not the child's (CUDA does not survive fork). */
static void after_fork_child(void)
{
    pthread_mutex_init(&table_lock, NULL);
    table = (struct graph_table){0};
    allocating = 0;
}

static void register_fork_handler(void) { pthread_atfork(NULL, NULL, after_fork_child); }

/* ---- what the wrappers call ---------------------------------------------------------------- */

/* Frees an entry's costs (caller holds table_lock). */
static void drop_costs(struct entry *e)
{
    if (e->costs.memory != NULL)
        __atomic_sub_fetch(&allocating, 1, __ATOMIC_RELEASE);
    vgpu_graph_costs_free(&e->costs);
}

int vgpu_graph_remember(CUgraphExec exec, struct vgpu_graph_costs *costs)
{
    int rc = 0;
    if (exec == NULL || exec == tombstone) {
        vgpu_graph_costs_free(costs);
    } else {
        pthread_once(&fork_once, register_fork_handler);
        vgpu_lock(&table_lock);
        struct entry *e = find(exec);
        if (e != NULL)
            drop_costs(e);
        else
            e = new_slot(exec);
        if (e != NULL) {
            *e = (struct entry){.exec = exec, .serial = ++last_serial, .total = total_of(costs),
                                .costs = *costs};
            if (costs->memory != NULL)
                __atomic_add_fetch(&allocating, 1, __ATOMIC_RELEASE);
        } else {
            vgpu_graph_costs_free(costs);
            rc = -1;
        }
        vgpu_unlock(&table_lock);
    }
    *costs = (struct vgpu_graph_costs){0};
    return rc;
}

/* *into becomes the larger of the two records, per device; *from is taken (left NULL). */
static void larger_memory(struct vgpu_graph_memory **into, struct vgpu_graph_memory **from)
{
    struct vgpu_graph_memory *a = *into, *b = *from;
    *from = NULL;
    if (a == NULL) {
        *into = b;
        return;
    }
    for (int d = 0; b != NULL && d < VGPU_GRAPH_DEVICES; d++)
        a->bytes[d] = a->bytes[d] > b->bytes[d] ? a->bytes[d] : b->bytes[d];
    a->stack = b != NULL && b->stack > a->stack ? b->stack : a->stack;
    free(b);
}

void vgpu_graph_memory_merge(struct vgpu_graph_costs *into, struct vgpu_graph_costs *from)
{
    larger_memory(&into->memory, &from->memory);
}

/* The entry's memory becomes the larger of its own and *memory (taken), per device. Caller
 * holds table_lock. */
static void absorb_memory(struct entry *e, struct vgpu_graph_memory **memory)
{
    if (e->costs.memory == NULL && *memory != NULL)
        __atomic_add_fetch(&allocating, 1, __ATOMIC_RELEASE);
    larger_memory(&e->costs.memory, memory);
}

/* costs->memory becomes the larger of the entry's and its own, per device: an update that
 * could change what the allocation nodes take never makes it less than what may run. Caller
 * holds table_lock. */
static void keep_larger_memory(struct entry *e, struct vgpu_graph_costs *costs)
{
    absorb_memory(e, &costs->memory);
    costs->memory = e->costs.memory;
}

int vgpu_graph_update(CUgraphExec exec, struct vgpu_graph_costs *costs)
{
    vgpu_lock(&table_lock);
    struct entry *e = find(exec);
    if (e != NULL) {
        /* Both lists in node-list order, walked together: a new cost takes the name of the
         * old node at its place (nodes added by setters, at UINT32_MAX, pair with none). */
        struct vgpu_node_cost *old = e->costs.nodes, *now = costs->nodes;
        size_t nold = e->costs.count, nnow = costs->count;
        if (nold > 0)
            qsort(old, nold, sizeof *old, by_position);
        if (nnow > 0)
            qsort(now, nnow, sizeof *now, by_position);
        for (size_t i = 0, j = 0; i < nnow; i++) {
            while (j < nold && old[j].position < now[i].position)
                j++;
            if (j < nold && old[j].position == now[i].position)
                now[i].node = old[j].node;
        }
        if (nnow > 0)
            qsort(now, nnow, sizeof *now, by_node);
        free(old);
        keep_larger_memory(e, costs);
        e->costs = *costs;
        e->total = total_of(costs);
        *costs = (struct vgpu_graph_costs){0};
    }
    vgpu_unlock(&table_lock);
    return e != NULL ? 0 : vgpu_graph_remember(exec, costs);
}

uint64_t vgpu_graph_more_memory(CUgraphExec exec, struct vgpu_graph_costs *costs)
{
    vgpu_lock(&table_lock);
    struct entry *e = find(exec);
    uint64_t serial = e != NULL ? e->serial : 0;
    if (e != NULL)
        absorb_memory(e, &costs->memory);
    vgpu_unlock(&table_lock);
    if (e != NULL || costs->memory == NULL) {
        vgpu_graph_costs_free(costs);
        return serial;
    }
    return vgpu_graph_remember(exec, costs) == 0 ? vgpu_graph_serial(exec) : 0;
}

static struct vgpu_node_cost *node_cost(struct entry *e, CUgraphNode node)
{
    if (e->costs.count == 0)
        return NULL; /* bsearch must not be given a NULL array */
    struct vgpu_node_cost key = {.node = node};
    return bsearch(&key, e->costs.nodes, e->costs.count, sizeof key, by_node);
}

/* Adds a node the table did not know, kept sorted; out of memory, its cost joins the total
 * alone (charged, never forgotten). */
static void add_node(struct entry *e, CUgraphNode node, uint64_t blocks)
{
    struct vgpu_graph_costs *c = &e->costs;
    struct vgpu_node_cost *grown = realloc(c->nodes, (c->count + 1) * sizeof *grown);
    e->total = add(e->total, blocks);
    if (grown == NULL)
        return;
    size_t at = 0;
    while (at < c->count && (uintptr_t)grown[at].node < (uintptr_t)node)
        at++;
    memmove(&grown[at + 1], &grown[at], (c->count - at) * sizeof *grown);
    grown[at] = (struct vgpu_node_cost){.node = node, .blocks = blocks, .position = UINT32_MAX,
                                        .enabled = 1};
    c->nodes = grown;
    c->count++;
}

/* A node's cost or state changed from `before` (its cost while enabled, 0 when disabled). A
 * saturated total stays near saturation: more than it should be, never less. */
static void retotal(struct entry *e, uint64_t before, uint64_t after)
{
    e->total = add(e->total - before, after);
}

void vgpu_graph_set_node(CUgraphExec exec, CUgraphNode node, uint64_t blocks)
{
    blocks = clamp(blocks);
    vgpu_lock(&table_lock);
    struct entry *e = find(exec);
    struct vgpu_node_cost *n = e != NULL ? node_cost(e, node) : NULL;
    if (n != NULL) {
        uint64_t before = n->enabled ? n->blocks : 0;
        n->blocks = blocks;
        retotal(e, before, n->enabled ? blocks : 0);
    } else if (e != NULL) {
        add_node(e, node, blocks);
    }
    vgpu_unlock(&table_lock);
}

void vgpu_graph_enable_node(CUgraphExec exec, CUgraphNode node, int enabled)
{
    vgpu_lock(&table_lock);
    struct entry *e = find(exec);
    struct vgpu_node_cost *n = e != NULL ? node_cost(e, node) : NULL;
    if (n != NULL && n->enabled != (enabled != 0)) {
        n->enabled = enabled != 0;
        retotal(e, n->enabled ? 0 : n->blocks, n->enabled ? n->blocks : 0);
    }
    vgpu_unlock(&table_lock);
}

uint64_t vgpu_graph_cost(CUgraphExec exec)
{
    /* A signal handler's launch while this thread changes the table (locks.h): the cost of a
     * graph that cannot be read. */
    if (vgpu_lock_unless_mine(&table_lock) != 0)
        return unread_blocks;
    const struct entry *e = find(exec);
    uint64_t blocks = e != NULL ? e->total : 0;
    vgpu_unlock(&table_lock);
    return blocks != 0 ? blocks : 1;
}

uint64_t vgpu_graph_memory_of(CUgraphExec exec, struct vgpu_graph_memory *memory)
{
    if (__atomic_load_n(&allocating, __ATOMIC_ACQUIRE) == 0)
        return 0;
    if (vgpu_lock_unless_mine(&table_lock) != 0)
        return VGPU_GRAPH_UNKNOWN_SERIAL;
    const struct entry *e = find(exec);
    uint64_t serial = e != NULL && e->costs.memory != NULL ? e->serial : 0;
    if (serial != 0)
        *memory = *e->costs.memory;
    vgpu_unlock(&table_lock);
    return serial;
}

uint64_t vgpu_graph_serial(CUgraphExec exec)
{
    vgpu_lock(&table_lock);
    const struct entry *e = find(exec);
    uint64_t serial = e != NULL ? e->serial : 0;
    vgpu_unlock(&table_lock);
    return serial;
}

int vgpu_graph_forget(CUgraphExec exec, uint64_t serial)
{
    vgpu_lock(&table_lock);
    struct entry *e = find(exec);
    if (e != NULL && e->serial != serial)
        e = NULL; /* recorded anew since: another graph's now */
    if (e != NULL) {
        drop_costs(e);
        *e = (struct entry){.exec = tombstone};
        /* A tombstone just before an empty slot ends no probe chain: empty it, and those
         * before it, so that lookups of unknown execs stop early. */
        size_t mask = table.capacity - 1, i = (size_t)(e - table.slots);
        if (table.slots[(i + 1) & mask].exec == NULL) {
            for (size_t n = 0; n < table.capacity && table.slots[i].exec == tombstone;
                 n++, i = (i - 1) & mask) {
                table.slots[i].exec = NULL;
                table.used--;
            }
        }
    }
    vgpu_unlock(&table_lock);
    return e != NULL ? 0 : -1;
}
