/* The fake CUDA driver's parts (fake_cuda.c, fake_memory.c, fake_graphs.c): what they
 * share. The fake stands for NVIDIA's libcuda.so.1 in the shim's tests; it keeps real
 * bookkeeping of each device's memory (fake_device.c) and models what the real driver does
 * that the shim must follow: addresses and handles reused as soon as they are freed, VMM
 * memory freed at the last unmap and release, pools that keep freed memory up to their
 * release threshold until a synchronization, graph memory reserved at launch and kept
 * until a trim, the device heap and stack reserved at the next launch, module globals
 * taken at load, several devices, and kernels that take time on a device time-sliced
 * between contexts (fake_clock.c). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "driver_types.h"
#include "fake_device.h"

typedef int CUresult;

#define OK 0
#define INVALID 1
#define OOM 2
#define INVALID_CONTEXT 201
#define NOT_FOUND 500
#define NOT_READY 600

/* FAKE_CUDA_LOG: a file each call appends its name to. */
void called(const char *name);
#define CALLED called(__func__)

extern pthread_mutex_t fake_mu; /* every table below */

/* A map of keys to objects: buckets of chained entries (malloc'd; a test double). */
struct entry {
  uint64_t key;
  void *value;
  struct entry *next;
};
struct map {
  struct entry *bucket[4096];
};
void *map_get(struct map *m, uint64_t key);
void map_put(struct map *m, uint64_t key, void *value);
void *map_take(struct map *m, uint64_t key);

/* Device addresses: a freed range is handed out again at once when it fits. */
uint64_t address_take(uint64_t bytes, uint64_t *region);
void address_give(uint64_t address, uint64_t region);
uint64_t handle_take(void); /* VMM handles and pools: ids, reused LIFO */
void handle_give(uint64_t handle);

int current_device(void); /* the calling thread's context's device; -1: none */
void synchronized(void);  /* pools give back what they keep past their threshold */
int launched(int device); /* the heap and stack are reserved: 0 if the device is full */
/* fake_clock.c: kernels that take time (FAKE_CUDA_KERNEL_US). */
void fake_clock_launch(int device); /* queues one kernel (waits while the queue is full) */
void fake_clock_drain(int device);  /* waits until the process's work there is done */

/* What cuMemAllocAsync does: from the device's current pool, or into a capture. */
CUresult stream_allocation(CUdeviceptr *p, size_t bytes, void *pool, void *stream);
CUresult stream_free(CUdeviceptr p, void *stream);
/* fake_graphs.c: a capture recording this stream, if any, takes the call. */
int capture_allocation(void *stream, CUdeviceptr *p, size_t bytes, int device);
int capture_free(void *stream, CUdeviceptr p);
void graph_memory_freed(CUdeviceptr p); /* a graph's allocation freed outside its graph */
int is_graph_memory(CUdeviceptr p);
