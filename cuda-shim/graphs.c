/*
 * CUDA graphs' memory: allocation nodes (cuGraphAddMemAllocNode, or a cuMemAllocAsync a
 * stream capture records) take nothing when they are added; the driver reserves their
 * memory in the device's graph pool when an executable graph is uploaded or launched,
 * keeps it reserved across launches, and gives it back only at cuDeviceGraphMemTrim.
 *
 * So the shim charges each device's graph pool what the driver says it reserves
 * (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT), read after every upload and launch of a graph
 * that has allocation nodes and after every trim. In advance: when a graph is
 * instantiated the shim walks it (child graphs included) and sums its allocation nodes;
 * a launch or upload whose allocations cannot fit in the pool's unused reserved memory
 * beside what the pod holds is refused with CUDA_ERROR_OUT_OF_MEMORY before it runs. A
 * captured cuMemAllocAsync is checked against the budget, not charged (the launch is).
 *
 * Graphs without allocation nodes cost nothing: they are not in the table, and their
 * launches go straight to the driver. Not followed: the bodies of conditional nodes.
 */
#include "shim.h"
#include <sys/mman.h>


#define MAX_DEPTH 8
#define STACK_NODES 512

static struct table execs; /* executable graph -> pack(bytes, ordinal) */
static int captures;       /* a stream capture has begun in this process */
static uint64_t charged_graphs[BUDGET_DEVICES];

void graphs_reset(void) {
  table_release(&execs);
  captures = 0;
  for (int i = 0; i < BUDGET_DEVICES; i++) charged_graphs[i] = 0;
}

int capturing(CUstream stream) {
  if (!__atomic_load_n(&captures, __ATOMIC_RELAXED)) return 0;
  typedef CUresult (*fn_t)(CUstream, int *);
  fn_t is = DRIVER(fn_t, "cuStreamIsCapturing");
  int status = 0;
  return is && is(stream, &status) == CUDA_SUCCESS && status == CU_STREAM_CAPTURE_STATUS_ACTIVE;
}

/* The bytes of a graph's allocation nodes, and the device of the last one. */
static uint64_t graph_bytes(CUgraph graph, int *ordinal, int depth) {
  typedef CUresult (*nodes_fn)(CUgraph, CUgraphNode *, size_t *);
  typedef CUresult (*type_fn)(CUgraphNode, int *);
  typedef CUresult (*params_fn)(CUgraphNode, CUDA_MEM_ALLOC_NODE_PARAMS *);
  typedef CUresult (*child_fn)(CUgraphNode, CUgraph *);
  nodes_fn nodes_of = DRIVER(nodes_fn, "cuGraphGetNodes");
  type_fn type_of = DRIVER(type_fn, "cuGraphNodeGetType");
  params_fn params_of = DRIVER(params_fn, "cuGraphMemAllocNodeGetParams");
  child_fn child_of = DRIVER(child_fn, "cuGraphChildGraphNodeGetGraph");
  size_t count = 0;
  if (!nodes_of || !type_of || nodes_of(graph, NULL, &count) != CUDA_SUCCESS || !count) return 0;
  CUgraphNode stack[STACK_NODES], *nodes = stack;
  size_t mapped = 0;
  if (count > STACK_NODES) {
    mapped = count * sizeof *nodes;
    void *region = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED) return 0;
    nodes = region;
  }
  uint64_t bytes = 0;
  if (nodes_of(graph, nodes, &count) == CUDA_SUCCESS) {
    for (size_t i = 0; i < count; i++) {
      int type = -1;
      if (type_of(nodes[i], &type) != CUDA_SUCCESS) continue;
      CUDA_MEM_ALLOC_NODE_PARAMS params;
      CUgraph child;
      if (type == CU_GRAPH_NODE_TYPE_MEM_ALLOC && params_of &&
          params_of(nodes[i], &params) == CUDA_SUCCESS &&
          params.poolProps.location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        bytes += params.bytesize;
        *ordinal = params.poolProps.location.id;
      } else if (type == CU_GRAPH_NODE_TYPE_GRAPH && depth < MAX_DEPTH && child_of &&
                 child_of(nodes[i], &child) == CUDA_SUCCESS) {
        bytes += graph_bytes(child, ordinal, depth + 1);
      }
    }
  }
  if (mapped) munmap(nodes, mapped);
  return bytes;
}

static uint64_t graph_memory(int ordinal, int attr) {
  typedef CUresult (*fn_t)(CUdevice, int, void *);
  fn_t get = DRIVER(fn_t, "cuDeviceGetGraphMemAttribute");
  uint64_t value = 0;
  if (!get || get(ordinal, attr, &value) != CUDA_SUCCESS) return 0;
  return value;
}

/* What a graph of `bytes` allocations would add to the device's graph pool, at least. */
static uint64_t growth(int ordinal, uint64_t bytes) {
  uint64_t reserved = graph_memory(ordinal, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT);
  uint64_t used = graph_memory(ordinal, CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT);
  uint64_t spare = reserved > used ? reserved - used : 0;
  return bytes > spare ? bytes - spare : 0;
}

/* Charges the device's graph pool what the driver reserves (less what the caller charged
 * for this call already). */
static void settle(int ordinal, uint64_t charged) {
  int index = device_index(ordinal);
  if (index < 0) return;
  uint64_t reserved = graph_memory(ordinal, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT);
  pthread_mutex_lock(&shim.mu);
  uint64_t before = charged_graphs[index];
  charged_graphs[index] = reserved;
  pthread_mutex_unlock(&shim.mu);
  int64_t change = (int64_t)reserved - (int64_t)before - (int64_t)charged;
  if (change > 0) charge(index, (uint64_t)change, "CUDA graph memory", 1);
  else uncharge(index, (uint64_t)-change);
}

/* Charges, in advance, what running `bytes` of graph allocations on `ordinal` adds;
 * 0: refused. */
static int ahead(int ordinal, uint64_t bytes, const char *call, uint64_t *charged) {
  *charged = growth(ordinal, bytes);
  return !*charged || charge(device_index(ordinal), *charged, call, 0);
}

/* ---- captures ---- */
#define BEGIN(name, call_args, ...)                          \
  typedef CUresult (*fn_t)(__VA_ARGS__);                     \
  fn_t fn = REAL(name, fn_t);                                \
  if (!fn) return CUDA_ERROR_NOT_FOUND;                      \
  __atomic_store_n(&captures, 1, __ATOMIC_RELAXED);          \
  return fn call_args;

EXPORT CUresult cuStreamBeginCapture(CUstream stream) {
  BEGIN(cuStreamBeginCapture, (stream), CUstream)
}
EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream stream) {
  BEGIN(cuStreamBeginCapture_ptsz, (stream), CUstream)
}
EXPORT CUresult cuStreamBeginCapture_v2(CUstream stream, int mode) {
  BEGIN(cuStreamBeginCapture_v2, (stream, mode), CUstream, int)
}
EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream stream, int mode) {
  BEGIN(cuStreamBeginCapture_v2_ptsz, (stream, mode), CUstream, int)
}
EXPORT CUresult cuStreamBeginCaptureToGraph(CUstream stream, CUgraph graph,
                                            const CUgraphNode *deps, const void *edges,
                                            size_t count, int mode) {
  BEGIN(cuStreamBeginCaptureToGraph, (stream, graph, deps, edges, count, mode), CUstream,
        CUgraph, const CUgraphNode *, const void *, size_t, int)
}
EXPORT CUresult cuStreamBeginCaptureToGraph_ptsz(CUstream stream, CUgraph graph,
                                                 const CUgraphNode *deps, const void *edges,
                                                 size_t count, int mode) {
  BEGIN(cuStreamBeginCaptureToGraph_ptsz, (stream, graph, deps, edges, count, mode), CUstream,
        CUgraph, const CUgraphNode *, const void *, size_t, int)
}

/* ---- instantiation: what the executable graph will allocate ---- */
struct plan {
  uint64_t bytes, charged;
  int ordinal, upload;
};

static int before_instantiate(CUgraph graph, int upload, struct plan *plan) {
  *plan = (struct plan){.upload = upload};
  if (!active()) return 1;
  plan->ordinal = current_ordinal();
  plan->bytes = graph_bytes(graph, &plan->ordinal, 0);
  if (!plan->bytes) return 1;
  pthread_mutex_lock(&shim.mu);
  int room = table_reserve(&execs);
  pthread_mutex_unlock(&shim.mu);
  if (!room) return 0;
  if (upload && !ahead(plan->ordinal, plan->bytes, "cuGraphInstantiate", &plan->charged)) {
    table_unreserve();
    return 0;
  }
  return 1;
}

static CUresult after_instantiate(CUresult rc, CUgraphExec *exec, const struct plan *plan) {
  if (!plan->bytes) return rc;
  pthread_mutex_lock(&shim.mu);
  if (rc == CUDA_SUCCESS)
    table_put(&execs, (uint64_t)(uintptr_t)*exec, pack(plan->bytes, plan->ordinal, 0, 0), 0,
              NULL, NULL);
  else
    table_unreserve();
  pthread_mutex_unlock(&shim.mu);
  if (rc == CUDA_SUCCESS && plan->upload) settle(plan->ordinal, plan->charged);
  else uncharge(device_index(plan->ordinal), plan->charged);
  return rc;
}

#define INSTANTIATE(name, upload, call_args, ...)                                \
  typedef CUresult (*fn_t)(__VA_ARGS__);                                         \
  fn_t fn = REAL(name, fn_t);                                                    \
  if (!fn) return CUDA_ERROR_NOT_FOUND;                                          \
  struct plan plan;                                                              \
  if (!before_instantiate(graph, (upload), &plan)) return CUDA_ERROR_OUT_OF_MEMORY; \
  return after_instantiate(fn call_args, exec, &plan);

EXPORT CUresult cuGraphInstantiate(CUgraphExec *exec, CUgraph graph, CUgraphNode *error_node,
                                   char *log, size_t size) {
  INSTANTIATE(cuGraphInstantiate, 0, (exec, graph, error_node, log, size), CUgraphExec *,
              CUgraph, CUgraphNode *, char *, size_t)
}
EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *exec, CUgraph graph, CUgraphNode *error_node,
                                      char *log, size_t size) {
  INSTANTIATE(cuGraphInstantiate_v2, 0, (exec, graph, error_node, log, size), CUgraphExec *,
              CUgraph, CUgraphNode *, char *, size_t)
}
EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *exec, CUgraph graph,
                                            unsigned long long flags) {
  INSTANTIATE(cuGraphInstantiateWithFlags, (flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) != 0,
              (exec, graph, flags), CUgraphExec *, CUgraph, unsigned long long)
}
EXPORT CUresult cuGraphInstantiateWithParams(CUgraphExec *exec, CUgraph graph,
                                             CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
  INSTANTIATE(cuGraphInstantiateWithParams,
              params && (params->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) != 0,
              (exec, graph, params), CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *)
}
EXPORT CUresult cuGraphInstantiateWithParams_ptsz(CUgraphExec *exec, CUgraph graph,
                                                  CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
  INSTANTIATE(cuGraphInstantiateWithParams_ptsz,
              params && (params->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) != 0,
              (exec, graph, params), CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *)
}

EXPORT CUresult cuGraphExecDestroy(CUgraphExec exec) {
  typedef CUresult (*fn_t)(CUgraphExec);
  fn_t fn = REAL(cuGraphExecDestroy, fn_t);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  if (!active()) return fn(exec);
  uint64_t a = 0;
  pthread_mutex_lock(&shim.mu);
  int found = table_take(&execs, (uint64_t)(uintptr_t)exec, &a, NULL);
  pthread_mutex_unlock(&shim.mu);
  CUresult rc = fn(exec);
  if (found && rc != CUDA_SUCCESS) {
    pthread_mutex_lock(&shim.mu);
    table_put(&execs, (uint64_t)(uintptr_t)exec, a, 0, NULL, NULL);
    pthread_mutex_unlock(&shim.mu);
  }
  return rc; /* its memory stays reserved in the device's graph pool until a trim */
}

/* ---- running: the driver reserves the graph's memory ---- */
static CUresult charged_run(void *fn, CUgraphExec exec, CUstream stream, const char *call) {
  CUresult (*go)(CUgraphExec, CUstream) = (CUresult(*)(CUgraphExec, CUstream))fn;
  if (!active()) return go(exec, stream);
  uint64_t a = 0;
  pthread_mutex_lock(&shim.mu);
  int found = table_get(&execs, (uint64_t)(uintptr_t)exec, &a, NULL);
  pthread_mutex_unlock(&shim.mu);
  if (!found) return go(exec, stream); /* no allocation nodes */
  int ordinal = packed_index(a);
  uint64_t charged;
  if (!ahead(ordinal, packed_bytes(a), call, &charged)) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult rc = go(exec, stream);
  if (rc == CUDA_SUCCESS) settle(ordinal, charged);
  else uncharge(device_index(ordinal), charged);
  return rc;
}

/* A launch is paced to the pod's compute share (compute.c); an upload is not. */
static CUresult run(void *fn, CUgraphExec exec, CUstream stream, const char *call, int launch) {
  int paced = launch && compute_before();
  CUresult rc = charged_run(fn, exec, stream, call);
  compute_after(paced, stream, rc == CUDA_SUCCESS);
  return rc;
}

#define RUN(name, launch)                       \
  void *fn = real(W_##name);                    \
  if (!fn) return CUDA_ERROR_NOT_FOUND;         \
  return run(fn, exec, stream, #name, launch);

EXPORT CUresult cuGraphLaunch(CUgraphExec exec, CUstream stream) { RUN(cuGraphLaunch, 1) }
EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec exec, CUstream stream) {
  RUN(cuGraphLaunch_ptsz, 1)
}
EXPORT CUresult cuGraphUpload(CUgraphExec exec, CUstream stream) { RUN(cuGraphUpload, 0) }
EXPORT CUresult cuGraphUpload_ptsz(CUgraphExec exec, CUstream stream) {
  RUN(cuGraphUpload_ptsz, 0)
}

EXPORT CUresult cuDeviceGraphMemTrim(CUdevice device) {
  typedef CUresult (*fn_t)(CUdevice);
  fn_t fn = REAL(cuDeviceGraphMemTrim, fn_t);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  CUresult rc = fn(device);
  if (rc == CUDA_SUCCESS && active()) settle(device, 0);
  return rc;
}
