/*
 * Drives the CUDA driver API the ways applications do, for the shim's tests:
 *   probe MODE OP...
 * MODE: linked (calls the driver's exported names), dlsym (dlopen + dlsym, as XLA and
 * ctypes do), gpa or gpa-ptds (cuGetProcAddress_v2 for every name, as the CUDA runtime
 * does). OPs, in order, one line out each ("OP rc=N", or what the op prints):
 *
 *   stacked (each pushes what it made; free pops and frees it):
 *     alloc:N alloc1:N (the 32-bit ABI) managed:N managedhost:N async:N pool:N hostpool:N
 *     pitch:W:H create:N hostcreate:N array:W:H array3d:W:H:D mipmap:W:H:D
 *     module:PATH moduledata:PATH library:PATH
 *   named (=NAME keeps it in a register):
 *     vmm:N=R (create, reserve, map)  unmap:R  release:R  retain:R  export:R (prints the fd)
 *     import:R=S (R's export, imported and mapped)  importfd:PATH=S (an fd another process
 *     exported, opened through /proc/PID/fd/N)
 *     graph:N=G (an allocation node and its free)  graphkeep:N=G (no free)  child:N=G
 *     capture:N=G (a captured cuMemAllocAsync and its free)  launch:G  upload:G  drop:G
 *   mixed:THREADS:ROUNDS:BYTES (alloc, async and VMM rounds at random)
 *   ctx device:D info info1 total total1 used peak sync threshold:N pthreshold:N trim:N
 *   graphtrim heap:N stack:N kernel unwrapped hold hammer:THREADS:ROUNDS:BYTES
 *   bench:PAIRS:BYTES (allocation and free pairs a second)  abench:PAIRS:BYTES (async pairs)
 *   rss (the process's peak resident memory)  hold-briefly (a second)
 *   work:FROM:TO:BATCH:KIND  launches (KIND kernel, ex, coop or graph) until TO, a
 *     synchronization after every BATCH; prints the device time its kernels had between
 *     FROM and TO (fake_gpu_ns), the launches, and each batch's latency (p50, p99, in us)
 *     (FROM, TO: CLOCK_MONOTONIC in ms, as Python's time.monotonic)
 *   idle-until:T  sleeps until T (CLOCK_MONOTONIC ms)
 *   lbench:N  N kernel launches, then a synchronization (launches a second)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "driver_types.h"

typedef int CUresult;
/* Every entry point the probe uses: its field, exported name, lookup name and version. */
#define NAMES(X)                                                                        \
  X(init, "cuInit", "cuInit", 13000, CUresult (*)(unsigned))                             \
  X(retain, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", 13000,               \
    CUresult (*)(void **, int))                                                          \
  X(set_current, "cuCtxSetCurrent", "cuCtxSetCurrent", 13000, CUresult (*)(void *))      \
  X(alloc, "cuMemAlloc_v2", "cuMemAlloc", 13000, CUresult (*)(CUdeviceptr *, size_t))    \
  X(alloc1, "cuMemAlloc", "cuMemAlloc", 2000, CUresult (*)(unsigned *, unsigned))        \
  X(managed, "cuMemAllocManaged", "cuMemAllocManaged", 13000,                            \
    CUresult (*)(CUdeviceptr *, size_t, unsigned))                                       \
  X(async, "cuMemAllocAsync", "cuMemAllocAsync", 13000,                                  \
    CUresult (*)(CUdeviceptr *, size_t, void *))                                         \
  X(pool, "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync", 13000,                   \
    CUresult (*)(CUdeviceptr *, size_t, void *, void *))                                 \
  X(pitch, "cuMemAllocPitch_v2", "cuMemAllocPitch", 13000,                               \
    CUresult (*)(CUdeviceptr *, size_t *, size_t, size_t, unsigned))                     \
  X(free, "cuMemFree_v2", "cuMemFree", 13000, CUresult (*)(CUdeviceptr))                 \
  X(free1, "cuMemFree", "cuMemFree", 2000, CUresult (*)(unsigned))                       \
  X(free_async, "cuMemFreeAsync", "cuMemFreeAsync", 13000, CUresult (*)(CUdeviceptr, void *)) \
  X(create, "cuMemCreate", "cuMemCreate", 13000,                                         \
    CUresult (*)(unsigned long long *, size_t, const PROP *, unsigned long long))        \
  X(release, "cuMemRelease", "cuMemRelease", 13000, CUresult (*)(unsigned long long))    \
  X(reserve, "cuMemAddressReserve", "cuMemAddressReserve", 13000,                        \
    CUresult (*)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long))        \
  X(map, "cuMemMap", "cuMemMap", 13000,                                                  \
    CUresult (*)(CUdeviceptr, size_t, size_t, unsigned long long, unsigned long long))   \
  X(unmap, "cuMemUnmap", "cuMemUnmap", 13000, CUresult (*)(CUdeviceptr, size_t))         \
  X(retain_handle, "cuMemRetainAllocationHandle", "cuMemRetainAllocationHandle", 13000,  \
    CUresult (*)(unsigned long long *, void *))                                          \
  X(export_handle, "cuMemExportToShareableHandle", "cuMemExportToShareableHandle", 13000, \
    CUresult (*)(void *, unsigned long long, int, unsigned long long))                   \
  X(import_handle, "cuMemImportFromShareableHandle", "cuMemImportFromShareableHandle",   \
    13000, CUresult (*)(unsigned long long *, void *, int))                              \
  X(array, "cuArrayCreate_v2", "cuArrayCreate", 13000, CUresult (*)(void **, const ARRAY *)) \
  X(array3d, "cuArray3DCreate_v2", "cuArray3DCreate", 13000,                             \
    CUresult (*)(void **, const ARRAY3D *))                                              \
  X(array_destroy, "cuArrayDestroy", "cuArrayDestroy", 13000, CUresult (*)(void *))      \
  X(mipmap, "cuMipmappedArrayCreate", "cuMipmappedArrayCreate", 13000,                   \
    CUresult (*)(void **, const ARRAY3D *, unsigned))                                    \
  X(mipmap_destroy, "cuMipmappedArrayDestroy", "cuMipmappedArrayDestroy", 13000,         \
    CUresult (*)(void *))                                                                \
  X(info, "cuMemGetInfo_v2", "cuMemGetInfo", 13000, CUresult (*)(size_t *, size_t *))    \
  X(info1, "cuMemGetInfo", "cuMemGetInfo", 2000, CUresult (*)(unsigned *, unsigned *))   \
  X(total, "cuDeviceTotalMem_v2", "cuDeviceTotalMem", 13000, CUresult (*)(size_t *, int)) \
  X(total1, "cuDeviceTotalMem", "cuDeviceTotalMem", 2000, CUresult (*)(unsigned *, int)) \
  X(sync, "cuCtxSynchronize", "cuCtxSynchronize", 13000, CUresult (*)(void))             \
  X(pool_create, "cuMemPoolCreate", "cuMemPoolCreate", 13000,                            \
    CUresult (*)(void **, const POOL_PROPS *))                                           \
  X(pool_set, "cuMemPoolSetAttribute", "cuMemPoolSetAttribute", 13000,                   \
    CUresult (*)(void *, int, void *))                                                   \
  X(pool_trim, "cuMemPoolTrimTo", "cuMemPoolTrimTo", 13000, CUresult (*)(void *, size_t)) \
  X(device_pool, "cuDeviceGetMemPool", "cuDeviceGetMemPool", 13000,                      \
    CUresult (*)(void **, int))                                                          \
  X(stream_create, "cuStreamCreate", "cuStreamCreate", 13000, CUresult (*)(void **, unsigned)) \
  X(capture, "cuStreamBeginCapture_v2", "cuStreamBeginCapture", 13000,                   \
    CUresult (*)(void *, int))                                                           \
  X(end_capture, "cuStreamEndCapture", "cuStreamEndCapture", 13000,                      \
    CUresult (*)(void *, void **))                                                       \
  X(graph_create, "cuGraphCreate", "cuGraphCreate", 13000, CUresult (*)(void **, unsigned)) \
  X(add_alloc, "cuGraphAddMemAllocNode", "cuGraphAddMemAllocNode", 13000,                \
    CUresult (*)(void **, void *, void *, size_t, ALLOC_PARAMS *))                       \
  X(add_free, "cuGraphAddMemFreeNode", "cuGraphAddMemFreeNode", 13000,                   \
    CUresult (*)(void **, void *, void *, size_t, CUdeviceptr))                          \
  X(add_child, "cuGraphAddChildGraphNode", "cuGraphAddChildGraphNode", 13000,            \
    CUresult (*)(void **, void *, void *, size_t, void *))                               \
  X(instantiate, "cuGraphInstantiateWithFlags", "cuGraphInstantiate", 13000,             \
    CUresult (*)(void **, void *, unsigned long long))                                   \
  X(launch, "cuGraphLaunch", "cuGraphLaunch", 13000, CUresult (*)(void *, void *))       \
  X(upload, "cuGraphUpload", "cuGraphUpload", 13000, CUresult (*)(void *, void *))       \
  X(exec_destroy, "cuGraphExecDestroy", "cuGraphExecDestroy", 13000, CUresult (*)(void *)) \
  X(graph_trim, "cuDeviceGraphMemTrim", "cuDeviceGraphMemTrim", 13000, CUresult (*)(int)) \
  X(set_limit, "cuCtxSetLimit", "cuCtxSetLimit", 13000, CUresult (*)(int, size_t))       \
  X(kernel, "cuLaunchKernel", "cuLaunchKernel", 13000,                                   \
    CUresult (*)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,     \
                 unsigned, void *, void **, void **))                                    \
  X(kernel_ex, "cuLaunchKernelEx", "cuLaunchKernelEx", 13000,                           \
    CUresult (*)(const LAUNCH_CONFIG *, void *, void **, void **))                       \
  X(cooperative, "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel", 13000,        \
    CUresult (*)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,     \
                 unsigned, void *, void **))                                             \
  X(module_load, "cuModuleLoad", "cuModuleLoad", 13000, CUresult (*)(void **, const char *)) \
  X(module_data, "cuModuleLoadData", "cuModuleLoadData", 13000,                          \
    CUresult (*)(void **, const void *))                                                 \
  X(module_unload, "cuModuleUnload", "cuModuleUnload", 13000, CUresult (*)(void *))      \
  X(library_load, "cuLibraryLoadFromFile", "cuLibraryLoadFromFile", 13000,               \
    CUresult (*)(void **, const char *, int *, void **, unsigned, int *, void **, unsigned)) \
  X(library_unload, "cuLibraryUnload", "cuLibraryUnload", 13000, CUresult (*)(void *))

static struct {
#define FIELD(field, exported, base, version, type) __typeof__(type) field;
  NAMES(FIELD)
#undef FIELD
} cu;

/* Linked: the driver's exported names, as a program linked against libcuda calls them
 * (weak: a driver that no longer exports an old name leaves that op unusable, not the
 * probe unbuilt). */
#define DECLARE(field, exported, base, version, type) \
  extern void linked_##field(void) __asm__(exported) __attribute__((weak));
NAMES(DECLARE)
#undef DECLARE

static int missing(void) { return 500; /* CUDA_ERROR_NOT_FOUND: the driver lacks the name */ }

static int resolve(const char *mode) {
  if (strcmp(mode, "linked") == 0) {
#define LINK(field, exported, base, version, type) \
  cu.field = (type)(linked_##field ? linked_##field : (void (*)(void))missing);
    NAMES(LINK)
#undef LINK
    return 1;
  }
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return fprintf(stderr, "dlopen: %s\n", dlerror()), 0;
  CUresult (*gpa)(const char *, void **, int, unsigned long long, int *) = NULL;
  if (strncmp(mode, "gpa", 3) == 0) {
    *(void **)&gpa = dlsym(lib, "cuGetProcAddress_v2");
    if (!gpa) return fprintf(stderr, "no cuGetProcAddress_v2\n"), 0;
  }
  unsigned long long flags = strcmp(mode, "gpa-ptds") == 0 ? 2 : 0;
  void *fn;
  int status;
#define LOOK(field, exported, base, version, type)                                 \
  fn = NULL;                                                                       \
  if (gpa) {                                                                       \
    if (gpa(base, &fn, version, flags, &status)) fn = NULL;                        \
  } else {                                                                         \
    fn = dlsym(lib, exported);                                                     \
  }                                                                                \
  if (!fn) return fprintf(stderr, "cannot resolve %s (%d)\n", base, version), 0;   \
  cu.field = (type)fn;
  NAMES(LOOK)
#undef LOOK
  return 1;
}

/* ---- what the ops made ---- */
struct made { char kind; unsigned long long key; };
static struct made stack[4096];
static int depth;
static void push(char kind, unsigned long long key) { if (depth < 4096) stack[depth++] = (struct made){kind, key}; }

static CUresult pop(void) {
  if (!depth) return -1;
  struct made m = stack[--depth];
  switch (m.kind) {
    case 'm': return cu.free(m.key);
    case 'v': return cu.free1((unsigned)m.key);
    case 'a': return cu.free_async(m.key, NULL);
    case 'h': return cu.release(m.key);
    case 'r': return cu.array_destroy((void *)(uintptr_t)m.key);
    case 'p': return cu.mipmap_destroy((void *)(uintptr_t)m.key);
    case 'o': return cu.module_unload((void *)(uintptr_t)m.key);
    case 'l': return cu.library_unload((void *)(uintptr_t)m.key);
  }
  return -1;
}

static struct reg { char name[16]; unsigned long long handle, va, size; void *exec; int fd; } regs[32];
static struct reg *named(const char *name) {
  for (int i = 0; i < 32; i++)
    if (strcmp(regs[i].name, name) == 0) return &regs[i];
  for (int i = 0; i < 32; i++)
    if (!regs[i].name[0]) {
      snprintf(regs[i].name, sizeof regs[i].name, "%s", name);
      return &regs[i];
    }
  return &regs[31];
}

static int current = 0;

static uint64_t fake(const char *name, int device) {
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  uint64_t (*fn)(int) = NULL;
  if (lib) *(void **)&fn = dlsym(lib, name);
  return fn ? fn(device) : 0;
}

static double monotonic_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

static int by_value(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Launch after launch until `to`, as a training or serving loop does (see work: above). */
static CUresult work(double from, double to, unsigned long long batch, const char *kind) {
  static double latency[1 << 16];
  size_t batches = 0;
  unsigned long long launches = 0, start_ns = 0, end_ns = 0;
  int started = 0;
  void *exec = NULL, *graph;
  LAUNCH_CONFIG config = {.grid = {1, 1, 1}, .block = {1, 1, 1}};
  CUresult rc = 0;
  if (strcmp(kind, "graph") == 0) {
    rc = cu.graph_create(&graph, 0);
    if (!rc) rc = cu.instantiate(&exec, graph, 0);
  }
  while (!rc) {
    double now = monotonic_ms(), began = now;
    if (!started && now >= from) start_ns = fake("fake_gpu_ns", current), started = 1;
    if (now >= to) break;
    for (unsigned long long i = 0; i < batch && !rc; i++, launches++) {
      if (strcmp(kind, "ex") == 0) rc = cu.kernel_ex(&config, NULL, NULL, NULL);
      else if (strcmp(kind, "coop") == 0) rc = cu.cooperative(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL);
      else if (exec) rc = cu.launch(exec, NULL);
      else rc = cu.kernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    }
    if (!rc) rc = cu.sync();
    if (batches < sizeof latency / sizeof *latency) latency[batches++] = (monotonic_ms() - began) * 1e3;
  }
  end_ns = fake("fake_gpu_ns", current);
  qsort(latency, batches, sizeof *latency, by_value);
  printf("work rc=%d gpu_ns=%llu launches=%llu p50_us=%.0f p99_us=%.0f\n", rc,
         started ? end_ns - start_ns : 0, launches, batches ? latency[batches / 2] : 0.0,
         batches ? latency[batches * 99 / 100] : 0.0);
  return rc;
}
static void *device_pool, *host_pool;
static void *pool_of(int host) {
  void **pool = host ? &host_pool : &device_pool;
  if (!*pool) {
    POOL_PROPS props = {.allocType = 1, .location = {host ? 2 : 1, host ? 0 : current}};
    if (cu.pool_create(pool, &props)) *pool = NULL;
  }
  return *pool;
}


/* A graph with one allocation node of `bytes` (freed in the graph unless `keep`), made a
 * child of another graph when `child`; instantiated into `r`. */
static CUresult graph_of(unsigned long long bytes, int keep, int child, struct reg *r) {
  void *g, *node;
  CUresult rc = cu.graph_create(&g, 0);
  ALLOC_PARAMS params = {.poolProps = {.allocType = 1, .location = {1, current}}, .bytesize = bytes};
  if (!rc) rc = cu.add_alloc(&node, g, NULL, 0, &params);
  if (!rc && !keep) rc = cu.add_free(&node, g, &node, 1, params.dptr);
  if (!rc && child) {
    void *outer;
    rc = cu.graph_create(&outer, 0);
    if (!rc) rc = cu.add_child(&node, outer, NULL, 0, g);
    g = outer;
  }
  return rc ? rc : cu.instantiate(&r->exec, g, 0);
}

static CUresult captured(unsigned long long bytes, int keep, struct reg *r) {
  void *stream, *g;
  CUdeviceptr p;
  CUresult rc = cu.stream_create(&stream, 0);
  if (!rc) rc = cu.capture(stream, 0);
  if (!rc) rc = cu.async(&p, bytes, stream);
  if (!rc && !keep) rc = cu.free_async(p, stream);
  CUresult end = cu.end_capture(stream, &g);
  return rc ? rc : end ? end : cu.instantiate(&r->exec, g, 0);
}

static uint64_t limit, held, worst;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static size_t hammer_bytes;
static int hammer_rounds;
static long refused, granted, failed_frees;

static void *hammer(void *arg) {
  unsigned seed = (unsigned)(uintptr_t)arg;
  for (int i = 0; i < hammer_rounds; i++) {
    CUdeviceptr p;
    size_t bytes = hammer_bytes / 2 + (size_t)(rand_r(&seed) % (unsigned)(hammer_bytes / 2 + 1));
    CUresult rc = cu.alloc(&p, bytes);
    pthread_mutex_lock(&mu);
    if (rc == 0) {
      granted++, held += bytes;
      if (held > worst) worst = held;
    } else {
      refused++;
    }
    pthread_mutex_unlock(&mu);
    if (rc == 0) {
      if (rand_r(&seed) % 4 == 0) usleep(100);
      pthread_mutex_lock(&mu);
      held -= bytes;
      pthread_mutex_unlock(&mu);
      if (cu.free(p)) {
        pthread_mutex_lock(&mu);
        failed_frees++;
        pthread_mutex_unlock(&mu);
      }
    }
  }
  return NULL;
}

/* Each round, one of: alloc and free, an async pair, a VMM create, map, release, unmap. */
static void *mixed(void *arg) {
  unsigned seed = (unsigned)(uintptr_t)arg;
  for (int i = 0; i < hammer_rounds; i++) {
    size_t bytes = hammer_bytes / 2 + (size_t)(rand_r(&seed) % (unsigned)(hammer_bytes / 2 + 1));
    CUdeviceptr p, va;
    unsigned long long h;
    CUresult rc;
    switch (rand_r(&seed) % 3) {
      case 0:
        if ((rc = cu.alloc(&p, bytes)) == 0) rc = cu.free(p) ? -1 : 0;
        break;
      case 1:
        if ((rc = cu.async(&p, bytes, NULL)) == 0) rc = cu.free_async(p, NULL) ? -1 : 0;
        break;
      default: {
        PROP prop = {.type = 1, .location = {1, current}};
        if ((rc = cu.create(&h, bytes, &prop, 0)) == 0) {
          int bad = cu.reserve(&va, bytes, 0, 0, 0) || cu.map(va, bytes, 0, h, 0) ||
                    cu.release(h) || cu.unmap(va, bytes);
          rc = bad ? -1 : 0;
        }
      }
    }
    pthread_mutex_lock(&mu);
    if (rc == 0) granted++;
    else if (rc == 2) refused++;
    else failed_frees++;
    pthread_mutex_unlock(&mu);
  }
  return NULL;
}

static void *file_image(const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat info;
  if (fd < 0 || fstat(fd, &info) != 0) return NULL;
  char *image = calloc(1, (size_t)info.st_size + 1);
  if (read(fd, image, (size_t)info.st_size) != info.st_size) image[0] = 0;
  close(fd);
  return image;
}

int main(int argc, char **argv) {
  if (argc < 2 || !resolve(argv[1])) return 2;
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char *text = getenv("PROBE_LIMIT");
  limit = text ? strtoull(text, NULL, 10) : 0;
  cu.init(0);
  void *ctx;
  for (int i = 2; i < argc; i++) {
    const char *op = argv[i];
    char arg[256] = "", name[16] = "", second[16] = "";
    unsigned long long a = 0, b = 0, c = 0;
    CUresult rc = 0;
    CUdeviceptr p = 0;
    const char *eq = strchr(op, '=');
    if (eq) snprintf(name, sizeof name, "%s", eq + 1);
    if (sscanf(op, "alloc:%llu", &a) == 1) { rc = cu.alloc(&p, a); if (!rc) push('m', p); }
    else if (sscanf(op, "alloc1:%llu", &a) == 1) {
      unsigned small;
      rc = cu.alloc1(&small, (unsigned)a);
      if (!rc) push('v', small);
    }
    else if (sscanf(op, "managedhost:%llu", &a) == 1) { rc = cu.managed(&p, a, 2); if (!rc) push('m', p); }
    else if (sscanf(op, "managed:%llu", &a) == 1) { rc = cu.managed(&p, a, 1); if (!rc) push('m', p); }
    else if (sscanf(op, "async:%llu", &a) == 1) { rc = cu.async(&p, a, NULL); if (!rc) push('a', p); }
    else if (sscanf(op, "pool:%llu", &a) == 1) { rc = cu.pool(&p, a, pool_of(0), NULL); if (!rc) push('a', p); }
    else if (sscanf(op, "hostpool:%llu", &a) == 1) { rc = cu.pool(&p, a, pool_of(1), NULL); if (!rc) push('a', p); }
    else if (sscanf(op, "pitch:%llu:%llu", &a, &b) == 2) {
      size_t pitch;
      rc = cu.pitch(&p, &pitch, a, b, 4);
      if (!rc) push('m', p);
    } else if (sscanf(op, "create:%llu", &a) == 1 || sscanf(op, "hostcreate:%llu", &a) == 1) {
      PROP prop = {.type = 1, .location = {op[0] == 'h' ? 2 : 1, current}};
      unsigned long long h;
      rc = cu.create(&h, a, &prop, 0);
      if (!rc) push('h', h);
    } else if (sscanf(op, "vmm:%llu=", &a) == 1) {
      struct reg *r = named(name);
      PROP prop = {.type = 1, .location = {1, current}};
      r->size = a;
      rc = cu.create(&r->handle, a, &prop, 0);
      if (!rc) rc = cu.reserve(&r->va, a, 0, 0, 0);
      if (!rc) rc = cu.map(r->va, a, 0, r->handle, 0);
    } else if (sscanf(op, "unmap:%15s", arg) == 1) {
      struct reg *r = named(arg);
      rc = cu.unmap(r->va, r->size);
    } else if (sscanf(op, "release:%15s", arg) == 1) {
      rc = cu.release(named(arg)->handle);
    } else if (sscanf(op, "retain:%15s", arg) == 1) {
      struct reg *r = named(arg);
      unsigned long long h;
      rc = cu.retain_handle(&h, (void *)(uintptr_t)r->va);
      if (!rc && h != r->handle) rc = -2;
    } else if (sscanf(op, "export:%15s", arg) == 1) {
      struct reg *r = named(arg);
      rc = cu.export_handle(&r->fd, r->handle, 1, 0);
      printf("exported fd=%d pid=%d\n", rc ? -1 : r->fd, (int)getpid());
    } else if (sscanf(op, "importfd:%255[^=]=%15s", arg, second) == 2) {
      struct reg *r = named(second);
      int fd = open(arg, O_RDONLY | O_CLOEXEC);
      struct stat info;
      rc = fd < 0 || fstat(fd, &info) != 0 ? -3 : 0;
      if (!rc) r->size = (unsigned long long)info.st_size;
      if (!rc) rc = cu.import_handle(&r->handle, (void *)(intptr_t)fd, 1);
      if (!rc) rc = cu.reserve(&r->va, r->size, 0, 0, 0);
      if (!rc) rc = cu.map(r->va, r->size, 0, r->handle, 0);
    } else if (sscanf(op, "import:%15[^=]=%15s", arg, second) == 2) {
      struct reg *from = named(arg), *r = named(second);
      r->size = from->size;
      rc = cu.import_handle(&r->handle, (void *)(intptr_t)from->fd, 1);
      if (!rc) rc = cu.reserve(&r->va, r->size, 0, 0, 0);
      if (!rc) rc = cu.map(r->va, r->size, 0, r->handle, 0);
    } else if (sscanf(op, "array3d:%llu:%llu:%llu", &a, &b, &c) == 3) {
      ARRAY3D d = {a, b, c, 0x20, 1, 0};
      void *arr;
      rc = cu.array3d(&arr, &d);
      if (!rc) push('r', (uintptr_t)arr);
    } else if (sscanf(op, "array:%llu:%llu", &a, &b) == 2) {
      ARRAY d = {a, b, 0x20, 1};
      void *arr;
      rc = cu.array(&arr, &d);
      if (!rc) push('r', (uintptr_t)arr);
    } else if (sscanf(op, "mipmap:%llu:%llu:%llu", &a, &b, &c) == 3) {
      ARRAY3D d = {a, b, c, 0x20, 1, 0};
      void *arr;
      rc = cu.mipmap(&arr, &d, 3);
      if (!rc) push('p', (uintptr_t)arr);
    } else if (sscanf(op, "graph:%llu=", &a) == 1) {
      rc = graph_of(a, 0, 0, named(name));
    } else if (sscanf(op, "graphkeep:%llu=", &a) == 1) {
      rc = graph_of(a, 1, 0, named(name));
    } else if (sscanf(op, "child:%llu=", &a) == 1) {
      rc = graph_of(a, 0, 1, named(name));
    } else if (sscanf(op, "capture:%llu=", &a) == 1) {
      rc = captured(a, 0, named(name));
    } else if (sscanf(op, "launch:%15s", arg) == 1) {
      rc = cu.launch(named(arg)->exec, NULL);
    } else if (sscanf(op, "upload:%15s", arg) == 1) {
      rc = cu.upload(named(arg)->exec, NULL);
    } else if (sscanf(op, "drop:%15s", arg) == 1) {
      rc = cu.exec_destroy(named(arg)->exec);
    } else if (strcmp(op, "graphtrim") == 0) {
      rc = cu.graph_trim(current);
    } else if (sscanf(op, "heap:%llu", &a) == 1) {
      rc = cu.set_limit(2, a);
    } else if (sscanf(op, "stack:%llu", &a) == 1) {
      rc = cu.set_limit(0, a);
    } else if (strcmp(op, "kernel") == 0) {
      rc = cu.kernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    } else if (sscanf(op, "moduledata:%255s", arg) == 1) {
      void *image = file_image(arg), *m;
      rc = cu.module_data(&m, image);
      free(image);
      if (!rc) push('o', (uintptr_t)m);
    } else if (sscanf(op, "module:%255s", arg) == 1) {
      void *m;
      rc = cu.module_load(&m, arg);
      if (!rc) push('o', (uintptr_t)m);
    } else if (sscanf(op, "library:%255s", arg) == 1) {
      void *l;
      rc = cu.library_load(&l, arg, NULL, NULL, 0, NULL, NULL, 0);
      if (!rc) push('l', (uintptr_t)l);
    } else if (sscanf(op, "threshold:%llu", &a) == 1 || sscanf(op, "pthreshold:%llu", &a) == 1) {
      void *pool = NULL;
      if (op[0] == 'p') pool = pool_of(0);
      else rc = cu.device_pool(&pool, current);
      uint64_t value = a;
      if (!rc) rc = cu.pool_set(pool, 4, &value);
    } else if (sscanf(op, "trim:%llu", &a) == 1) {
      void *pool = NULL;
      rc = cu.device_pool(&pool, current);
      if (!rc) rc = cu.pool_trim(pool, a);
    } else if (strcmp(op, "sync") == 0) rc = cu.sync();
    else if (strcmp(op, "free") == 0) rc = pop();
    else if (strcmp(op, "ctx") == 0 || sscanf(op, "device:%llu", &a) == 1) {
      current = (int)a;
      rc = cu.retain(&ctx, current);
      if (!rc) rc = cu.set_current(ctx);
    } else if (strcmp(op, "info") == 0) {
      size_t f, t;
      rc = cu.info(&f, &t);
      printf("info rc=%d free=%zu total=%zu\n", rc, f, t);
      continue;
    } else if (strcmp(op, "info1") == 0) {
      unsigned f, t;
      rc = cu.info1(&f, &t);
      printf("info1 rc=%d free=%u total=%u\n", rc, f, t);
      continue;
    } else if (strcmp(op, "total") == 0) {
      size_t t;
      rc = cu.total(&t, current);
      printf("total rc=%d total=%zu\n", rc, t);
      continue;
    } else if (strcmp(op, "total1") == 0) {
      unsigned t;
      rc = cu.total1(&t, current);
      printf("total1 rc=%d total=%u\n", rc, t);
      continue;
    } else if (strcmp(op, "unwrapped") == 0) {
      rc = cu.kernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL) | cu.sync();
    } else if (strcmp(op, "used") == 0) {
      printf("used bytes=%llu\n", (unsigned long long)fake("fake_device_used", current));
      continue;
    } else if (strcmp(op, "peak") == 0) {
      printf("peak bytes=%llu\n", (unsigned long long)fake("fake_device_peak", current));
      continue;
    } else if (strcmp(op, "rss") == 0) {
      char line[256];
      unsigned long long peak = 0;
      FILE *status = fopen("/proc/self/status", "r");
      while (status && fgets(line, sizeof line, status))
        if (sscanf(line, "VmHWM: %llu kB", &peak) == 1) break;
      if (status) fclose(status);
      printf("rss peak_kib=%llu\n", peak);
      continue;
    } else if (sscanf(op, "abench:%llu:%llu", &a, &b) == 2) {
      for (unsigned long long n = 0; n < a && !rc; n++) {
        rc = cu.async(&p, b, NULL);
        if (!rc) rc = cu.free_async(p, NULL);
      }
    } else if (strncmp(op, "work:", 5) == 0) {
      double from, to;
      char kind[16] = "kernel";
      if (sscanf(op, "work:%lf:%lf:%llu:%15s", &from, &to, &a, kind) < 3) {
        fprintf(stderr, "bad %s\n", op);
        return 2;
      }
      work(from, to, a ? a : 1, kind);
      continue;
    } else if (sscanf(op, "lbench:%llu", &a) == 1) {
      double began = monotonic_ms();
      for (unsigned long long n = 0; n < a && !rc; n++)
        rc = cu.kernel(NULL, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
      if (!rc) rc = cu.sync();
      double seconds = (monotonic_ms() - began) / 1e3;
      printf("lbench rc=%d launches=%llu seconds=%.6f launches_per_second=%.0f\n", rc, a,
             seconds, seconds > 0 ? (double)a / seconds : 0.0);
      continue;
    } else if (strncmp(op, "idle-until:", 11) == 0) {
      double until = atof(op + 11), now;
      while ((now = monotonic_ms()) < until) usleep((useconds_t)((until - now) * 1000));
      continue;
    } else if (strcmp(op, "hold-briefly") == 0) {
      sleep(1);
      continue;
    } else if (strcmp(op, "hold") == 0) {
      printf("holding\n");
      pause();
      continue;
    } else if (sscanf(op, "bench:%llu:%llu", &a, &b) == 2) {
      struct timespec t0, t1;
      clock_gettime(CLOCK_MONOTONIC, &t0);
      for (unsigned long long n = 0; n < a && !rc; n++) {
        rc = cu.alloc(&p, b);
        if (!rc) rc = cu.free(p);
      }
      clock_gettime(CLOCK_MONOTONIC, &t1);
      double seconds = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
      printf("bench rc=%d pairs=%llu seconds=%.6f pairs_per_second=%.0f\n", rc, a, seconds,
             seconds > 0 ? (double)a / seconds : 0.0);
      continue;
    } else if (sscanf(op, "hammer:%llu:%llu:%llu", &a, &b, &c) == 3 ||
               sscanf(op, "mixed:%llu:%llu:%llu", &a, &b, &c) == 3) {
      pthread_t threads[64];
      hammer_rounds = (int)b, hammer_bytes = c;
      if (a > 64) a = 64;
      void *(*run)(void *) = op[0] == 'm' ? mixed : hammer;
      for (unsigned long long t = 0; t < a; t++) pthread_create(&threads[t], NULL, run, (void *)(uintptr_t)(t + 1));
      for (unsigned long long t = 0; t < a; t++) pthread_join(threads[t], NULL);
      printf("%s granted=%ld refused=%ld worst=%llu limit=%llu failed_frees=%ld\n",
             op[0] == 'm' ? "mixed" : "hammer", granted, refused, (unsigned long long)worst,
             (unsigned long long)limit, failed_frees);
      continue;
    } else {
      fprintf(stderr, "unknown op %s\n", op);
      return 2;
    }
    printf("%s rc=%d\n", op, rc);
  }
  return 0;
}
