/*
 * libgpupack-cuda.so's shared declarations: the driver API types it reads, the process's
 * state and the interfaces between its parts. Each part is a file of its own:
 *
 *   state.c     configuration, logging, the fork and exec rules, `active()`
 *   budget.c    the pod's budget file: slots, devices, charging (lock-free across processes)
 *   table.c     the per-process tables (open addressing, no tombstones, mmap'd storage)
 *   lookup.c    how applications reach the driver: the real functions, dlsym, cuGetProcAddress
 *   memory.c    linear allocations: cuMemAlloc*, managed, pitched, arrays, the frees
 *   pools.c     stream-ordered pools: charged what they keep, host pools not at all
 *   vmm.c       cuMemCreate and its handles: reference counts over maps, retains, exports
 *   graphs.c    graph memory nodes and captured allocations: charged as the driver reserves
 *   measure.c   NVML read around a call: what a context or a module took
 *   contexts.c  contexts (measured), the device heap and stack (cuCtxSetLimit)
 *   modules.c   module globals: read from a cubin, or measured
 *   info.c      what the pod sees: cuMemGetInfo, cuDeviceTotalMem, NVML
 *   compute.c   launches paced to the pod's compute share, beside the GPU's other pods
 *
 * Everything not listed in entries.h is never touched.
 */
#ifndef GPUPACK_SHIM_H
#define GPUPACK_SHIM_H

#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define EXPORT __attribute__((visibility("default")))
/* For what a sanitizer's own start-up reaches through dlsym, before its shadow exists. */
#define UNINSTRUMENTED \
  __attribute__((no_sanitize_address, no_sanitize("thread", "undefined")))

/* ---- the driver API's types and constants, as cuda.h and nvml.h define them (64-bit) ---- */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned int CUdeviceptr_v1;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUmemoryPool;
typedef void *CUarray;
typedef void *CUmipmappedArray;
typedef void *CUgraph;
typedef void *CUgraphExec;
typedef void *CUgraphNode;
typedef void *CUmodule;
typedef void *CUlibrary;
typedef int CUdriverProcAddressQueryResult;
typedef struct {
  size_t Width, Height;
  int Format;
  unsigned NumChannels;
} CUDA_ARRAY_DESCRIPTOR;
typedef struct {
  unsigned Width, Height;
  int Format;
  unsigned NumChannels;
} CUDA_ARRAY_DESCRIPTOR_v1;
typedef struct {
  size_t Width, Height, Depth;
  int Format;
  unsigned NumChannels, Flags;
} CUDA_ARRAY3D_DESCRIPTOR;
typedef struct {
  unsigned Width, Height, Depth;
  int Format;
  unsigned NumChannels, Flags;
} CUDA_ARRAY3D_DESCRIPTOR_v1;
typedef struct {
  int type, id;
} CUmemLocation;
typedef struct {
  int type, requestedHandleTypes;
  CUmemLocation location;
  /* win32HandleMetaData and allocFlags follow; only location is read */
} CUmemAllocationProp;
typedef struct {
  int allocType, handleTypes;
  CUmemLocation location;
  void *win32SecurityAttributes;
  size_t maxSize;
  unsigned short usage;
  unsigned char reserved[54];
} CUmemPoolProps;
typedef struct {
  CUmemPoolProps poolProps;
  const void *accessDescs;
  size_t accessDescCount;
  size_t bytesize;
  CUdeviceptr dptr;
} CUDA_MEM_ALLOC_NODE_PARAMS;
typedef struct {
  unsigned long long flags;
  CUstream hUploadStream;
  CUgraphNode hErrNode_out;
  int result_out;
} CUDA_GRAPH_INSTANTIATE_PARAMS;
typedef struct {
  unsigned char bytes[16];
} CUuuid;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_FOUND 500
#define CU_MEM_LOCATION_TYPE_DEVICE 1
#define CU_MEM_ATTACH_HOST 2
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2
#define CU_MEMPOOL_ATTR_RELEASE_THRESHOLD 4
#define CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT 5
#define CU_MEMPOOL_ATTR_USED_MEM_CURRENT 7
#define CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT 0
#define CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT 2
#define CU_GRAPH_NODE_TYPE_GRAPH 4
#define CU_GRAPH_NODE_TYPE_MEM_ALLOC 10
#define CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD 2
#define CU_STREAM_CAPTURE_STATUS_ACTIVE 1
#define CU_LIMIT_STACK_SIZE 0
#define CU_LIMIT_PRINTF_FIFO_SIZE 1
#define CU_LIMIT_MALLOC_HEAP_SIZE 2
#define CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT 16
#define CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR 39

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef struct {
  unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
  unsigned int version;
  unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_NOT_SUPPORTED 3

/* ---- the wrapped entry points (entries.h) ---- */
enum {
#define ENTRY(name, base, since, ptds) W_##name,
#include "entries.h"
#undef ENTRY
  W_COUNT
};

/* ---- limits of the bookkeeping ---- */
#define MAX_ORDINALS 64  /* device ordinals a process may name */
#define BUDGET_DEVICES 16 /* devices one pod's budget tells apart (by UUID) */

/* ---- state.c: the process's configuration ---- */
extern struct shim {
  pthread_mutex_t mu; /* the tables below, and configuration */
  int state;          /* UNCONFIGURED, READY */
  int active;         /* a limit applies */
  uint64_t limit;     /* bytes, per device */
  char dir[256];
  int quiet;
} shim;
enum { UNCONFIGURED = 0, READY = 2 };

int active(void);      /* configures on first use; 1 when a limit applies */
void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void human(char *out, size_t size, uint64_t bytes);
const char *shim_getenv(const char *name); /* secure_getenv: nothing in setuid programs */

/* ---- budget.c: the pod's budget ---- */
int budget_open(const char *dir);  /* claims a slot; 0: fail closed (every charge refused) */
void budget_drop(void);            /* a fork child's: unmaps, closes, no slot */
int budget_usable(void);           /* a slot is held */
int budget_slot(void);
int device_index(CUdevice ordinal); /* the budget's index of a device; -1: none */
int device_index_by_uuid(const unsigned char uuid[16]);
int current_ordinal(void);          /* the device of the calling thread's context */
int current_index(void);
void note_device(int index);        /* this process holds a context or memory there */
/* Charges `bytes` on device `index` unless the pod would pass its limit there (`force`:
 * charge anyway). `call` names the entry point for the refusal's line. */
int charge(int index, uint64_t bytes, const char *call, int force);
void uncharge(int index, uint64_t bytes);
uint64_t pod_used(int index);       /* every live process's, dead ones' reclaimed first */
int fits(int index, uint64_t bytes, const char *call); /* no charge: would it be granted? */

/* ---- table.c: key -> two words, per process, under shim.mu ---- */
struct table {
  uint64_t *keys, *a, *b; /* key 0 = empty */
  size_t cap, count;
};
int table_reserve(struct table *t); /* room for one more; 0: no memory (fail before the call) */
void table_unreserve(void);         /* a reservation the call did not use */
/* Inserts or replaces; returns 1 and the old values when the key was there. */
int table_put(struct table *t, uint64_t key, uint64_t a, uint64_t b, uint64_t *old_a,
              uint64_t *old_b);
int table_take(struct table *t, uint64_t key, uint64_t *a, uint64_t *b);
int table_get(const struct table *t, uint64_t key, uint64_t *a, uint64_t *b);
void table_release(struct table *t);

/* ---- lookup.c: the driver's functions ---- */
void *real(int which);
void *libcuda(void);
void *libnvml(void);
void *driver_symbol(const char *name); /* an entry point we call ourselves, never wrap */
void *wrapper(int which);              /* wrappers.c: our function for an entry */
/* A driver function the shim calls itself, looked up once per call site. */
#define DRIVER(type, name)                                              \
  ({                                                                    \
    static void *cached_;                                               \
    void *fn_ = __atomic_load_n(&cached_, __ATOMIC_ACQUIRE);            \
    if (!fn_ && (fn_ = driver_symbol(name)))                            \
      __atomic_store_n(&cached_, fn_, __ATOMIC_RELEASE);                \
    (type) fn_;                                                         \
  })
#define REAL(name, type) ((type)real(W_##name))

/* ---- memory.c: what an allocation took, for its free ---- */
/* An entry's first word: bytes (44 bits), the budget device (4), what kind (4), its pool (12). */
enum { KIND_CHARGED = 0, KIND_GRAPH = 1 };
uint64_t pack(uint64_t bytes, int index, int kind, int pool);
uint64_t packed_bytes(uint64_t a);
int packed_index(uint64_t a);
int packed_kind(uint64_t a);
int packed_pool(uint64_t a);
void memory_reset(void); /* a fork child: none of the parent's allocations */

/* ---- pools.c ---- */
int pool_index(CUmemoryPool pool, int create); /* -1: untracked */
int pool_is_host(int pool);
int pool_device(int pool);       /* the budget's device of a pool; -1: unknown */
int pool_keeps(int pool);        /* a release threshold above zero */
int pools_keep(void);            /* any pool of the process does */
CUmemoryPool current_pool(void); /* the device's current pool, for cuMemAllocAsync */
/* Around an allocation of `bytes` from `pool` on `index`: charge in advance what the pool
 * will hold more (0: refused), then settle on what it really holds. */
int pool_before(int pool, int index, uint64_t bytes, const char *call, int64_t *charged);
void pool_after(int pool, int index, uint64_t bytes, int64_t charged, int ok);
/* A free of `bytes` from `pool`: what the pool keeps of it stays charged; returns what to
 * give back. */
uint64_t pool_freed(int pool, uint64_t bytes);
void pools_reset(void);

/* ---- graphs.c ---- */
int capturing(CUstream stream); /* a stream capture is recording this stream */
void graphs_reset(void);

/* ---- measure.c: NVML around a driver call ---- */
#define MAX_PROCESSES 64
struct reading {
  int device_ok, own_ok;
  uint64_t device_used, own_used;
  unsigned count;
  nvmlProcessInfo_t processes[MAX_PROCESSES];
};
nvmlDevice_t nvml_device(int ordinal);
void read_nvml(nvmlDevice_t device, unsigned host_pid, struct reading *r);
unsigned newcomer(const struct reading *before, const struct reading *after);
/* What the call took: exact from the process's own line (`exact`), else the device's
 * growth, capped. */
uint64_t took(const struct reading *before, const struct reading *after, int *exact);

/* ---- compute.c: around a launch (paced: whether the after must record it) ---- */
int compute_before(void);
void compute_after(int paced, CUstream stream, int ok);
void compute_reset(void);

/* ---- contexts.c / modules.c / vmm.c ---- */
int has_context(int index);    /* this process made its first context there */
unsigned host_pid(int index);  /* this process as NVML names it there; 0: not known */
void contexts_reset(void);
void modules_reset(void);
void vmm_reset(void);

#endif
