/*
 * What the driver takes for a process beyond its allocations: its contexts, the modules it
 * loads (their __device__ globals), and the device-side heap and stack it asks for.
 *
 * Contexts and modules are measured: NVML is read around the driver's call. The exact
 * reading is the process's own line in NVML's list of GPU processes: the process that
 * appeared on the device while its first context was made is this one (NVML names host
 * PIDs, which a container cannot know otherwise). Failing that (two processes starting
 * at once, a driver that does not say), the device's used memory is compared before and
 * after, which a neighbour allocating at that moment skews: such a reading is capped at
 * MEASURE_CAP. A module is also read before it is loaded where its image says the size of
 * its globals (a cubin's .nv.global sections), and refused in advance past the budget;
 * one whose exact reading takes the pod past its limit is unloaded and refused.
 *
 * cuCtxSetLimit of the malloc heap, the printf FIFO or the per-thread stack (which the
 * driver reserves for every thread the device can run) is charged when it is set, for
 * what it adds to the default the context was measured with, and refused in advance
 * when that does not fit; lowering it gives the difference back.
 */
#include "shim.h"
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>


#define MEASURE_CAP (1ULL << 30)
#define MAX_PROCESSES 64
#define LIMITS 3 /* stack, printf FIFO, malloc heap */

static struct {
  unsigned char context[BUDGET_DEVICES]; /* this process's first context there was charged */
  unsigned host_pid[BUDGET_DEVICES];     /* this process as NVML names it; 0: not known */
  uint64_t limit_base[BUDGET_DEVICES][LIMITS];
  uint64_t limit_charged[BUDGET_DEVICES][LIMITS];
  unsigned char limit_known[BUDGET_DEVICES][LIMITS];
} c;
static struct table modules; /* module or library -> pack(bytes, device) */

void contexts_reset(void) {
  memset(&c, 0, sizeof c);
  table_release(&modules);
}

/* ---- NVML around a call ---- */
static nvmlDevice_t nvml_device(int ordinal) {
  typedef CUresult (*uuid_fn)(CUuuid *, CUdevice);
  typedef nvmlReturn_t (*init_fn)(void);
  typedef nvmlReturn_t (*by_uuid_fn)(const char *, nvmlDevice_t *);
  uuid_fn get_uuid = DRIVER(uuid_fn, "cuDeviceGetUuid_v2");
  if (!get_uuid) get_uuid = DRIVER(uuid_fn, "cuDeviceGetUuid");
  init_fn init = DRIVER(init_fn, "nvmlInit_v2");
  by_uuid_fn by_uuid = DRIVER(by_uuid_fn, "nvmlDeviceGetHandleByUUID");
  CUuuid id;
  if (!get_uuid || !init || !by_uuid || get_uuid(&id, ordinal) != CUDA_SUCCESS ||
      init() != NVML_SUCCESS)
    return NULL;
  char text[64];
  const unsigned char *u = id.bytes;
  snprintf(text, sizeof text,
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
           u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
           u[14], u[15]);
  nvmlDevice_t device;
  return by_uuid(text, &device) == NVML_SUCCESS ? device : NULL;
}

struct reading {
  int device_ok, own_ok;
  uint64_t device_used, own_used;
  unsigned count;
  nvmlProcessInfo_t processes[MAX_PROCESSES];
};

static void read_nvml(nvmlDevice_t device, unsigned host_pid, struct reading *r) {
  typedef nvmlReturn_t (*info_fn)(nvmlDevice_t, nvmlMemory_t *);
  typedef nvmlReturn_t (*list_fn)(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *);
  r->device_ok = r->own_ok = 0, r->count = 0;
  if (!device) return;
  info_fn info = (info_fn)real(W_nvmlDeviceGetMemoryInfo);
  nvmlMemory_t memory;
  if (info && info(device, &memory) == NVML_SUCCESS) r->device_ok = 1, r->device_used = memory.used;
  list_fn list = DRIVER(list_fn, "nvmlDeviceGetComputeRunningProcesses_v3");
  if (!list) list = DRIVER(list_fn, "nvmlDeviceGetComputeRunningProcesses_v2");
  unsigned count = MAX_PROCESSES;
  if (!list || list(device, &count, r->processes) != NVML_SUCCESS) return;
  r->count = count < MAX_PROCESSES ? count : MAX_PROCESSES;
  for (unsigned i = 0; host_pid && i < r->count; i++)
    if (r->processes[i].pid == host_pid && r->processes[i].usedGpuMemory != ~0ULL)
      r->own_ok = 1, r->own_used = r->processes[i].usedGpuMemory;
}

/* The one process on the device after that was not there before: this one. */
static unsigned newcomer(const struct reading *before, const struct reading *after) {
  unsigned found = 0, seen = 0;
  for (unsigned i = 0; i < after->count; i++) {
    int old = 0;
    for (unsigned j = 0; j < before->count && !old; j++)
      old = before->processes[j].pid == after->processes[i].pid;
    if (!old) found = after->processes[i].pid, seen++;
  }
  return seen == 1 ? found : 0;
}

/* What the call took: exact from the process's own line, else the device's growth,
 * capped. `exact` says which. */
static uint64_t took(const struct reading *before, const struct reading *after, int *exact) {
  *exact = before->own_ok && after->own_ok;
  if (*exact) return after->own_used > before->own_used ? after->own_used - before->own_used : 0;
  if (!before->device_ok || !after->device_ok || after->device_used <= before->device_used)
    return 0;
  uint64_t grew = after->device_used - before->device_used;
  return grew < MEASURE_CAP ? grew : MEASURE_CAP;
}

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

/* ---- modules ---- */
/* The bytes of a cubin's __device__ globals (.nv.global, .nv.global.init), read through
 * `at` (an image in memory, or a file). 0: not a cubin, or unreadable. */
typedef int (*reader)(const void *source, uint64_t offset, void *out, size_t bytes);

static int from_memory(const void *source, uint64_t offset, void *out, size_t bytes) {
  memcpy(out, (const unsigned char *)source + offset, bytes);
  return 1;
}
static int from_file(const void *source, uint64_t offset, void *out, size_t bytes) {
  return pread(*(const int *)source, out, bytes, (off_t)offset) == (ssize_t)bytes;
}

static uint64_t u64_at(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static uint32_t u32_at(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint16_t u16_at(const unsigned char *p) { uint16_t v; memcpy(&v, p, 2); return v; }

static uint64_t cubin_globals(reader at, const void *source) {
  unsigned char head[64], section[64], name[16];
  if (!at(source, 0, head, sizeof head) || memcmp(head, "\177ELF\2\1", 6) != 0 ||
      u16_at(head + 18) != 190 /* EM_CUDA */ || u16_at(head + 58) != 64)
    return 0;
  uint64_t table = u64_at(head + 40);
  unsigned count = u16_at(head + 60), names_index = u16_at(head + 62);
  if (!table || count > 4096 || names_index >= count || table > (1ULL << 30)) return 0;
  if (!at(source, table + (uint64_t)names_index * 64, section, sizeof section)) return 0;
  uint64_t names = u64_at(section + 24);
  if (names > (1ULL << 30)) return 0;
  uint64_t bytes = 0;
  for (unsigned i = 0; i < count; i++) {
    if (!at(source, table + (uint64_t)i * 64, section, sizeof section)) return 0;
    uint32_t offset = u32_at(section);
    if (!at(source, names + offset, name, 10)) return 0;
    if (memcmp(name, ".nv.global", 10) == 0) bytes += u64_at(section + 32);
  }
  return bytes;
}

static uint64_t image_globals(const void *image) {
  return image ? cubin_globals(from_memory, image) : 0;
}

static uint64_t file_globals(const char *path) {
  if (!path) return 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  uint64_t bytes = cubin_globals(from_file, &fd);
  close(fd);
  return bytes;
}

struct load {
  const char *call;
  int ordinal, index, measured;
  uint64_t declared;
  nvmlDevice_t device;
  struct reading before, after;
};

/* Before a module is loaded: charge what its image declares; 0: refused. */
static int before_load(struct load *l, const char *call, uint64_t declared) {
  l->call = call, l->declared = declared;
  l->ordinal = current_ordinal(), l->index = device_index(l->ordinal);
  pthread_mutex_lock(&shim.mu);
  int room = table_reserve(&modules);
  pthread_mutex_unlock(&shim.mu);
  if (!room) return 0;
  if (declared && !charge(l->index, declared, call, 0)) {
    table_unreserve();
    return 0;
  }
  l->measured = l->index >= 0 && c.context[l->index];
  l->device = l->measured ? nvml_device(l->ordinal) : NULL;
  if (l->measured) read_nvml(l->device, c.host_pid[l->index], &l->before);
  return 1;
}

/* After: charge what it took beyond its declared globals, record it; an exact reading
 * past the limit unloads it (`unload`) and refuses. */
static CUresult after_load(struct load *l, CUresult rc, void *handle, CUresult (*unload)(void *)) {
  if (rc != CUDA_SUCCESS) {
    table_unreserve();
    uncharge(l->index, l->declared);
    return rc;
  }
  uint64_t total = l->declared;
  int exact = 0;
  if (l->measured) {
    read_nvml(l->device, c.host_pid[l->index], &l->after);
    uint64_t measured = took(&l->before, &l->after, &exact);
    if (measured > total) {
      charge(l->index, measured - total, l->call, 1);
      total = measured;
    }
  }
  if (exact && total > l->declared && l->index >= 0 && pod_used(l->index) > shim.limit) {
    unload(handle);
    uncharge(l->index, total);
    table_unreserve();
    fits(l->index, total, l->call); /* says the refusal */
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  pthread_mutex_lock(&shim.mu);
  table_put(&modules, (uint64_t)(uintptr_t)handle, pack(total, l->index, 0, 0), 0, NULL, NULL);
  pthread_mutex_unlock(&shim.mu);
  return rc;
}

static CUresult unloaded(CUresult (*unload)(void *), void *handle) {
  if (!active()) return unload(handle);
  uint64_t a = 0;
  pthread_mutex_lock(&shim.mu);
  int found = table_take(&modules, (uint64_t)(uintptr_t)handle, &a, NULL);
  pthread_mutex_unlock(&shim.mu);
  CUresult rc = unload(handle);
  if (!found) return rc;
  if (rc == CUDA_SUCCESS) {
    uncharge(packed_index(a), packed_bytes(a));
  } else {
    pthread_mutex_lock(&shim.mu);
    table_put(&modules, (uint64_t)(uintptr_t)handle, a, 0, NULL, NULL);
    pthread_mutex_unlock(&shim.mu);
  }
  return rc;
}

#define LOAD(name, unload_name, declared, handle, call_args, ...)                        \
  typedef CUresult (*fn_t)(__VA_ARGS__);                                                   \
  fn_t fn = REAL(name, fn_t);                                                              \
  CUresult (*unload)(void *) = (CUresult(*)(void *))real(W_##unload_name);                 \
  if (!fn) return CUDA_ERROR_NOT_FOUND;                                                    \
  if (!active() || !unload) return fn call_args;                                           \
  struct load l;                                                                           \
  if (!before_load(&l, #name, (declared))) return CUDA_ERROR_OUT_OF_MEMORY;                \
  CUresult rc = fn call_args;                                                              \
  return after_load(&l, rc, rc == CUDA_SUCCESS ? (void *)*(handle) : NULL, unload);

EXPORT CUresult cuModuleLoad(CUmodule *module, const char *path) {
  LOAD(cuModuleLoad, cuModuleUnload, file_globals(path), module, (module, path), CUmodule *,
       const char *)
}
EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image) {
  LOAD(cuModuleLoadData, cuModuleUnload, image_globals(image), module, (module, image),
       CUmodule *, const void *)
}
EXPORT CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned count,
                                   int *options, void **values) {
  LOAD(cuModuleLoadDataEx, cuModuleUnload, image_globals(image), module,
       (module, image, count, options, values), CUmodule *, const void *, unsigned, int *,
       void **)
}
EXPORT CUresult cuModuleLoadFatBinary(CUmodule *module, const void *image) {
  LOAD(cuModuleLoadFatBinary, cuModuleUnload, image_globals(image), module, (module, image),
       CUmodule *, const void *)
}
EXPORT CUresult cuModuleUnload(CUmodule module) {
  void *fn = real(W_cuModuleUnload);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  return unloaded((CUresult(*)(void *))fn, module);
}
EXPORT CUresult cuLibraryLoadData(CUlibrary *library, const void *code, int *jit_options,
                                  void **jit_values, unsigned jit_count, int *options,
                                  void **values, unsigned count) {
  LOAD(cuLibraryLoadData, cuLibraryUnload, image_globals(code), library,
       (library, code, jit_options, jit_values, jit_count, options, values, count), CUlibrary *,
       const void *, int *, void **, unsigned, int *, void **, unsigned)
}
EXPORT CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *path, int *jit_options,
                                      void **jit_values, unsigned jit_count, int *options,
                                      void **values, unsigned count) {
  LOAD(cuLibraryLoadFromFile, cuLibraryUnload, file_globals(path), library,
       (library, path, jit_options, jit_values, jit_count, options, values, count), CUlibrary *,
       const char *, int *, void **, unsigned, int *, void **, unsigned)
}
EXPORT CUresult cuLibraryUnload(CUlibrary library) {
  void *fn = real(W_cuLibraryUnload);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  return unloaded((CUresult(*)(void *))fn, library);
}
