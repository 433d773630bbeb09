/*
 * Contexts and the device-side heap, printf FIFO and stack.
 *
 * A process's first context on a device is charged what it took there, measured
 * (measure.c); the process that appeared on the device meanwhile is this one, and NVML's
 * name for it is kept for later readings (modules.c).
 *
 * cuCtxSetLimit of the malloc heap, the printf FIFO or the per-thread stack (which the
 * driver reserves for every thread the device can run) is charged when it is set, for
 * what it adds to the default the context was measured with, and refused in advance
 * when that does not fit; lowering it gives the difference back.
 */
#include "shim.h"
#include <string.h>

#define LIMITS 3 /* stack, printf FIFO, malloc heap */

static struct {
  unsigned char context[BUDGET_DEVICES]; /* this process's first context there was charged */
  unsigned host_pid[BUDGET_DEVICES];     /* this process as NVML names it; 0: not known */
  uint64_t limit_base[BUDGET_DEVICES][LIMITS];
  uint64_t limit_charged[BUDGET_DEVICES][LIMITS];
  unsigned char limit_known[BUDGET_DEVICES][LIMITS];
} c;

void contexts_reset(void) { memset(&c, 0, sizeof c); }

int has_context(int index) { return index >= 0 && index < BUDGET_DEVICES && c.context[index]; }
unsigned host_pid(int index) { return index >= 0 && index < BUDGET_DEVICES ? c.host_pid[index] : 0; }

/* ---- contexts ---- */
static int context_first(int index) {
  if (index < 0) return 0;
  pthread_mutex_lock(&shim.mu);
  int first = !c.context[index];
  c.context[index] = 1;
  pthread_mutex_unlock(&shim.mu);
  return first;
}

static CUresult context_made(CUresult rc, int index, nvmlDevice_t device,
                             struct reading *before, struct reading *after) {
  if (rc != CUDA_SUCCESS) {
    pthread_mutex_lock(&shim.mu);
    c.context[index] = 0;
    pthread_mutex_unlock(&shim.mu);
    return rc;
  }
  note_device(index);
  read_nvml(device, 0, after);
  unsigned pid = newcomer(before, after);
  uint64_t bytes = 0;
  if (pid) {
    c.host_pid[index] = pid;
    for (unsigned i = 0; i < after->count; i++)
      if (after->processes[i].pid == pid && after->processes[i].usedGpuMemory != ~0ULL)
        bytes = after->processes[i].usedGpuMemory;
  } else {
    int exact;
    bytes = took(before, after, &exact);
  }
  charge(index, bytes, "the CUDA context", 1);
  return rc;
}

#define WITH_CONTEXT_CHARGE(ordinal, call)                              \
  if (!active()) return call;                                           \
  int index = device_index(ordinal);                                    \
  if (!context_first(index)) return call;                               \
  struct reading before, after;                                         \
  nvmlDevice_t nvml_ = nvml_device(ordinal);                            \
  read_nvml(nvml_, 0, &before);                                         \
  return context_made(call, index, nvml_, &before, &after);

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice device) {
  typedef CUresult (*fn_t)(CUcontext *, CUdevice);
  fn_t fn = REAL(cuDevicePrimaryCtxRetain, fn_t);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  WITH_CONTEXT_CHARGE(device, fn(ctx, device))
}
EXPORT CUresult cuCtxCreate(CUcontext *ctx, unsigned flags, CUdevice device) {
  typedef CUresult (*fn_t)(CUcontext *, unsigned, CUdevice);
  fn_t fn = REAL(cuCtxCreate, fn_t);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  WITH_CONTEXT_CHARGE(device, fn(ctx, flags, device))
}
EXPORT CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned flags, CUdevice device) {
  typedef CUresult (*fn_t)(CUcontext *, unsigned, CUdevice);
  fn_t fn = REAL(cuCtxCreate_v2, fn_t);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  WITH_CONTEXT_CHARGE(device, fn(ctx, flags, device))
}
EXPORT CUresult cuCtxCreate_v3(CUcontext *ctx, void *params, int count, unsigned flags,
                               CUdevice device) {
  typedef CUresult (*fn_t)(CUcontext *, void *, int, unsigned, CUdevice);
  fn_t fn = REAL(cuCtxCreate_v3, fn_t);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  WITH_CONTEXT_CHARGE(device, fn(ctx, params, count, flags, device))
}
EXPORT CUresult cuCtxCreate_v4(CUcontext *ctx, void *params, unsigned flags, CUdevice device) {
  typedef CUresult (*fn_t)(CUcontext *, void *, unsigned, CUdevice);
  fn_t fn = REAL(cuCtxCreate_v4, fn_t);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  WITH_CONTEXT_CHARGE(device, fn(ctx, params, flags, device))
}

/* ---- the device heap, the printf FIFO and the stack ---- */
static uint64_t limit_bytes(int ordinal, int limit, uint64_t value) {
  if (limit != CU_LIMIT_STACK_SIZE) return value;
  typedef CUresult (*attr_fn)(int *, int, CUdevice);
  attr_fn attr = DRIVER(attr_fn, "cuDeviceGetAttribute");
  int sms = 0, threads = 0;
  if (!attr || attr(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, ordinal) != CUDA_SUCCESS ||
      attr(&threads, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, ordinal) != CUDA_SUCCESS)
    return value;
  return value * (uint64_t)sms * (uint64_t)threads;
}

EXPORT CUresult cuCtxSetLimit(int limit, size_t value) {
  typedef CUresult (*fn_t)(int, size_t);
  fn_t fn = REAL(cuCtxSetLimit, fn_t);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  if (limit < 0 || limit >= LIMITS || !active()) return fn(limit, value);
  int ordinal = current_ordinal(), index = device_index(ordinal);
  if (index < 0) return fn(limit, value);
  if (!c.limit_known[index][limit]) { /* the default the context was measured with */
    typedef CUresult (*get_fn)(size_t *, int);
    get_fn get = DRIVER(get_fn, "cuCtxGetLimit");
    size_t base = 0;
    if (get && get(&base, limit) == CUDA_SUCCESS) {
      c.limit_base[index][limit] = limit_bytes(ordinal, limit, base);
      c.limit_known[index][limit] = 1;
    }
  }
  uint64_t wanted = limit_bytes(ordinal, limit, value), base = c.limit_base[index][limit];
  uint64_t charged = wanted > base ? wanted - base : 0, before = c.limit_charged[index][limit];
  static const char *const names[LIMITS] = {"cuCtxSetLimit(CU_LIMIT_STACK_SIZE)",
                                            "cuCtxSetLimit(CU_LIMIT_PRINTF_FIFO_SIZE)",
                                            "cuCtxSetLimit(CU_LIMIT_MALLOC_HEAP_SIZE)"};
  if (charged > before && !charge(index, charged - before, names[limit], 0))
    return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult rc = fn(limit, value);
  if (rc != CUDA_SUCCESS) {
    if (charged > before) uncharge(index, charged - before);
    return rc;
  }
  if (charged < before) uncharge(index, before - charged);
  c.limit_charged[index][limit] = charged;
  return rc;
}
