/*
 * libgpupack-cuda.so: holds a pod's processes to the pod's GPU memory share.
 *
 * Loaded into every process of a shared GPU container (/etc/ld.so.preload, served by the
 * node agent's CSI volume). It wraps the CUDA driver API's device-memory allocations and
 * its memory queries, and NVML's memory queries, and nothing else:
 *
 *   - every call that takes device memory is charged to one budget per pod (a file in the
 *     pod's directory, shared by all its processes and containers) and refused with
 *     CUDA_ERROR_OUT_OF_MEMORY past the pod's limit; the matching frees give it back;
 *   - cuMemGetInfo, cuDeviceTotalMem and nvmlDeviceGetMemoryInfo report the limit as the
 *     device's total and the limit less the pod's usage as free;
 *   - each process's context is charged once per device (NVML's used memory before and
 *     after the driver makes it);
 *   - with no limit configured every entry point is a pure pass-through.
 *
 * Applications reach the driver three ways and all three lead here: linking (our
 * exported names come first in the global scope), dlopen + dlsym (dlsym is wrapped and
 * hands out our functions for the names we wrap) and cuGetProcAddress (wrapped: the
 * driver's answer for a wrapped name and ABI version is swapped for ours).
 *
 * The budget file: a 64-byte header and SLOTS slots of 64 bytes. A process owns one slot
 * for life by holding an open-file-description write lock on it; the kernel drops the
 * lock when the process dies however it dies, so a slot nobody holds is a dead process's
 * and its usage no longer counts. Charging takes the header's lock (and a mutex within
 * the process), sums the live slots and adds to its own. Locks work across the pod's
 * PID namespaces, which are one per container unless the pod shares them.
 *
 * Configuration: the directory GPUPACK_CUDA_DIR (default /run/gpupack/cuda) holds
 * `limit` (bytes, decimal; absent or 0: no limit) and `budget`. GPUPACK_CUDA_QUIET=1
 * silences the first-call line; refusals are always said.
 *
 * Not a security boundary: a process can bypass the dynamic loader (a static binary),
 * talk to the device nodes itself, or write the budget file. It keeps honest frameworks
 * inside their share; the kernel's own limit (driver >= r615) binds everyone.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
/* For what a sanitizer's own start-up reaches through dlsym, before its shadow exists. */
#define UNINSTRUMENTED \
  __attribute__((no_sanitize_address, no_sanitize("thread", "undefined")))

/* ---- the driver API's types, as cuda.h and nvml.h define them (64-bit) ---- */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUmemoryPool;
typedef void *CUarray;
typedef void *CUmipmappedArray;
typedef int CUdriverProcAddressQueryResult;
typedef struct {
  size_t Width, Height;
  int Format;
  unsigned NumChannels;
} CUDA_ARRAY_DESCRIPTOR;
typedef struct {
  size_t Width, Height, Depth;
  int Format;
  unsigned NumChannels, Flags;
} CUDA_ARRAY3D_DESCRIPTOR;
typedef struct {
  int type, requestedHandleTypes;
  struct {
    int type, id;
  } location;
  /* win32HandleMetaData and allocFlags follow; only location is read */
} CUmemAllocationProp;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CU_MEM_LOCATION_TYPE_DEVICE 1
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM 2

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;
typedef struct {
  unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
  unsigned int version;
  unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
#define NVML_SUCCESS 0

/* ---- the budget file ---- */
#define MAGIC "GPUPACK1"
#define SLOTS 1024
#define SLOT_BYTES 64
#define HEADER_BYTES 64
#define BUDGET_BYTES (HEADER_BYTES + SLOTS * SLOT_BYTES)
#define MAX_DEVICES 64

struct slot {
  uint64_t used;    /* bytes this process holds */
  int32_t pid;      /* in its own PID namespace: for people reading the file */
  uint32_t refused; /* allocations refused */
  uint64_t peak;
  char pad[SLOT_BYTES - 24];
};

static const char *const ANNOTATION = "gpupack.io/gpu-memory";

/* ---- logging: one write(2) a line, never from malloc'd memory ---- */
static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...) {
  char line[512];
  int n = snprintf(line, sizeof line, "gpupack-cuda[%d]: ", (int)getpid());
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
  if (len > sizeof line - 2) len = sizeof line - 2;
  line[len++] = '\n';
  ssize_t ignored = write(2, line, len);
  (void)ignored;
}

static void human(char *out, size_t size, uint64_t bytes) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = (double)bytes;
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    unit++;
  }
  snprintf(out, size, unit ? "%.2f %s" : "%.0f %s", value, units[unit]);
}

/* ---- the real dlsym, and RTLD_NEXT on behalf of our caller ---- */
typedef void *(*dlsym_fn)(void *, const char *);
static dlsym_fn real_dlsym_fn;

UNINSTRUMENTED static void *real_dlsym(void *handle, const char *name) {
  dlsym_fn fn = __atomic_load_n(&real_dlsym_fn, __ATOMIC_ACQUIRE);
  if (!fn) {
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17", NULL};
    for (int i = 0; versions[i] && !fn; i++) fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    if (!fn) return NULL;
    __atomic_store_n(&real_dlsym_fn, fn, __ATOMIC_RELEASE);
  }
  return name ? fn(handle, name) : NULL;
}

/* glibc resolves RTLD_NEXT from the caller's address, which would now be ours: search the
 * objects loaded after the caller's, in load order, as it would. */
static void *next_after(const void *caller, const char *name) {
  Dl_info info;
  struct link_map *map = NULL;
  if (!dladdr1(caller, &info, (void **)&map, RTLD_DL_LINKMAP) || !map) return NULL;
  for (map = map->l_next; map; map = map->l_next) {
    void *found = real_dlsym(map, name);
    if (found) return found;
  }
  return NULL;
}

/* ---- per-process state ---- */
struct table { /* open addressing, key 0 = empty, tombstone = size UINT64_MAX */
  uint64_t *keys, *sizes;
  size_t cap, count;
};

static struct {
  pthread_mutex_t mu;
  int ready;   /* configuration read */
  int active;  /* a limit applies */
  pid_t pid;   /* the process that read it (a fork child reads it again) */
  uint64_t limit;
  int fd;
  unsigned char *map;
  struct slot *mine;
  int slot;
  unsigned refusals_said;
  struct table pointers, handles, arrays;
  unsigned char context_charged[MAX_DEVICES];
  char dir[256];
} st = {.mu = PTHREAD_MUTEX_INITIALIZER, .fd = -1, .slot = -1};

static struct slot *slot_at(int i) {
  return (struct slot *)(st.map + HEADER_BYTES + (size_t)i * SLOT_BYTES);
}

static int lock_range(int cmd, short type, off_t start, off_t len) {
  struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = start, .l_len = len};
  int rc;
  do rc = fcntl(st.fd, cmd, &fl);
  while (rc < 0 && errno == EINTR);
  return rc;
}

static int slot_held_by_other(int i) {
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET,
                     .l_start = HEADER_BYTES + (off_t)i * SLOT_BYTES, .l_len = SLOT_BYTES};
  if (fcntl(st.fd, F_OFD_GETLK, &fl) < 0) return 1; /* cannot tell: count it */
  return fl.l_type != F_UNLCK;
}

static int read_limit(const char *dir, uint64_t *limit) {
  char path[300], text[64];
  snprintf(path, sizeof path, "%s/limit", dir);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, text, sizeof text - 1);
  close(fd);
  if (n <= 0) return 0;
  text[n] = 0;
  char *end;
  errno = 0;
  unsigned long long value = strtoull(text, &end, 10);
  while (*end == ' ' || *end == '\n' || *end == '\t') end++;
  if (errno || *end || end == text) {
    say("ignoring %s: not a number of bytes", path);
    return 0;
  }
  *limit = value;
  return value > 0;
}

/* Opens the budget, sized and stamped under the header's lock, and claims a free slot. */
static int open_budget(void) {
  char path[300];
  snprintf(path, sizeof path, "%s/budget", st.dir);
  st.fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (st.fd < 0) {
    say("cannot open the budget %s: %s", path, strerror(errno));
    return 0;
  }
  if (lock_range(F_OFD_SETLKW, F_WRLCK, 0, HEADER_BYTES) < 0) goto fail;
  struct stat info;
  int ok = fstat(st.fd, &info) == 0 &&
           (info.st_size >= BUDGET_BYTES || ftruncate(st.fd, BUDGET_BYTES) == 0);
  if (ok) {
    fchmod(st.fd, 0666); /* every container of the pod, whatever its user */
    st.map = mmap(NULL, BUDGET_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, st.fd, 0);
    ok = st.map != MAP_FAILED;
    if (!ok) st.map = NULL;
  }
  if (ok && memcmp(st.map, MAGIC, 8) != 0) memcpy(st.map, MAGIC, 8);
  if (ok) {
    for (int i = 0; i < SLOTS && st.slot < 0; i++)
      if (lock_range(F_OFD_SETLK, F_WRLCK, HEADER_BYTES + (off_t)i * SLOT_BYTES, SLOT_BYTES) == 0)
        st.slot = i;
    if (st.slot >= 0) {
      st.mine = slot_at(st.slot);
      memset(st.mine, 0, sizeof *st.mine); /* a dead process's leftovers */
      st.mine->pid = (int32_t)getpid();
    } else {
      say("all %d budget slots of %s are taken", SLOTS, path);
      ok = 0;
    }
  }
  lock_range(F_OFD_SETLK, F_UNLCK, 0, HEADER_BYTES);
  if (ok) return 1;
fail:
  say("cannot use the budget %s: %s", path, strerror(errno));
  if (st.map) munmap(st.map, BUDGET_BYTES);
  st.map = NULL;
  close(st.fd);
  st.fd = -1;
  return 0;
}

static void table_reset(struct table *t) {
  free(t->keys);
  free(t->sizes);
  memset(t, 0, sizeof *t);
}

static void configure_locked(void) {
  if (st.ready && st.pid == getpid()) return;
  if (st.ready) { /* a fork child: its own slot, none of the parent's allocations */
    if (st.map) munmap(st.map, BUDGET_BYTES);
    if (st.fd >= 0) close(st.fd);
    table_reset(&st.pointers);
    table_reset(&st.handles);
    table_reset(&st.arrays);
    memset(st.context_charged, 0, sizeof st.context_charged);
    st.map = NULL, st.mine = NULL, st.fd = -1, st.slot = -1, st.active = 0;
  }
  st.ready = 1;
  st.pid = getpid();
  const char *dir = getenv("GPUPACK_CUDA_DIR");
  snprintf(st.dir, sizeof st.dir, "%s", dir && *dir ? dir : "/run/gpupack/cuda");
  if (!read_limit(st.dir, &st.limit)) return;
  if (!open_budget()) {
    /* A limit we cannot keep: refuse rather than run unbounded beside other pods. */
    st.active = 1;
    st.mine = NULL;
    return;
  }
  st.active = 1;
  const char *quiet = getenv("GPUPACK_CUDA_QUIET");
  if (!quiet || strcmp(quiet, "1") != 0) {
    char limit[32];
    human(limit, sizeof limit, st.limit);
    say("GPU memory limit %s (%" PRIu64 " bytes) for this pod, budget %s/budget, slot %d",
        limit, st.limit, st.dir, st.slot);
  }
}

static int active(void) {
  pthread_mutex_lock(&st.mu);
  configure_locked();
  int on = st.active;
  pthread_mutex_unlock(&st.mu);
  return on;
}

/* The pod's usage: every live slot. Caller holds st.mu and the header lock. */
static uint64_t pod_used_locked(void) {
  uint64_t total = st.mine ? st.mine->used : 0;
  for (int i = 0; i < SLOTS; i++) {
    if (i == st.slot) continue;
    struct slot *s = slot_at(i);
    uint64_t used = __atomic_load_n(&s->used, __ATOMIC_RELAXED);
    if (!used) continue;
    if (slot_held_by_other(i))
      total += used;
    else
      __atomic_store_n(&s->used, 0, __ATOMIC_RELAXED); /* its process is gone */
  }
  return total;
}

static uint64_t pod_used(void) {
  pthread_mutex_lock(&st.mu);
  uint64_t used = 0;
  if (st.mine && lock_range(F_OFD_SETLKW, F_WRLCK, 0, HEADER_BYTES) == 0) {
    used = pod_used_locked();
    lock_range(F_OFD_SETLK, F_UNLCK, 0, HEADER_BYTES);
  }
  pthread_mutex_unlock(&st.mu);
  return used;
}

/* Charges bytes to this process unless the pod would pass its limit (force: charge anyway). */
static int charge(uint64_t bytes, const char *call, int force) {
  pthread_mutex_lock(&st.mu);
  configure_locked();
  int ok = 0;
  uint64_t used = 0;
  if (st.mine && lock_range(F_OFD_SETLKW, F_WRLCK, 0, HEADER_BYTES) == 0) {
    used = pod_used_locked();
    if (force || (bytes <= st.limit && used <= st.limit - bytes)) {
      uint64_t now = __atomic_add_fetch(&st.mine->used, bytes, __ATOMIC_RELAXED);
      if (now > st.mine->peak) st.mine->peak = now;
      ok = 1;
    } else {
      st.mine->refused++;
    }
    lock_range(F_OFD_SETLK, F_UNLCK, 0, HEADER_BYTES);
  }
  int tell = !ok && st.refusals_said < 20;
  if (tell) st.refusals_said++;
  pthread_mutex_unlock(&st.mu);
  if (tell) {
    char want[32], have[32], limit[32];
    human(want, sizeof want, bytes);
    human(have, sizeof have, used);
    human(limit, sizeof limit, st.limit);
    if (st.mine)
      say("refused %s of %s: the pod's GPU memory limit is %s and its processes hold %s; "
          "raise the pod's %s annotation (or its policy's share) for more%s",
          call, want, limit, have, ANNOTATION,
          st.refusals_said == 20 ? " (further refusals are not logged)" : "");
    else
      say("refused %s of %s: the pod's budget in %s cannot be used, so its limit of %s "
          "cannot be kept", call, want, st.dir, limit);
  }
  return ok;
}

static void uncharge(uint64_t bytes) {
  pthread_mutex_lock(&st.mu);
  if (st.mine) {
    uint64_t held = __atomic_load_n(&st.mine->used, __ATOMIC_RELAXED);
    __atomic_store_n(&st.mine->used, held > bytes ? held - bytes : 0, __ATOMIC_RELAXED);
  }
  pthread_mutex_unlock(&st.mu);
}

/* ---- what each allocation took, to give it back at its free (caller holds st.mu) ---- */
static uint64_t mix(uint64_t key) {
  key ^= key >> 33;
  key *= 0xff51afd7ed558ccdULL;
  key ^= key >> 33;
  return key;
}

static int table_grow(struct table *t) {
  size_t cap = t->cap ? t->cap * 2 : 1024;
  uint64_t *keys = calloc(cap, sizeof *keys), *sizes = calloc(cap, sizeof *sizes);
  if (!keys || !sizes) {
    free(keys);
    free(sizes);
    return 0;
  }
  size_t count = 0;
  for (size_t i = 0; i < t->cap; i++) {
    if (!t->keys[i] || t->sizes[i] == UINT64_MAX) continue;
    size_t j = mix(t->keys[i]) & (cap - 1);
    while (keys[j]) j = (j + 1) & (cap - 1);
    keys[j] = t->keys[i], sizes[j] = t->sizes[i], count++;
  }
  free(t->keys);
  free(t->sizes);
  t->keys = keys, t->sizes = sizes, t->cap = cap, t->count = count;
  return 1;
}

static void table_put(struct table *t, uint64_t key, uint64_t size) {
  if (!key) return;
  if ((t->count + 1) * 2 > t->cap && !table_grow(t)) return;
  size_t j = mix(key) & (t->cap - 1);
  while (t->keys[j] && t->sizes[j] != UINT64_MAX && t->keys[j] != key) j = (j + 1) & (t->cap - 1);
  if (!t->keys[j] || t->sizes[j] == UINT64_MAX) t->count++;
  t->keys[j] = key, t->sizes[j] = size;
}

static uint64_t table_take(struct table *t, uint64_t key) {
  if (!key || !t->cap) return 0;
  size_t j = mix(key) & (t->cap - 1);
  while (t->keys[j]) {
    if (t->keys[j] == key && t->sizes[j] != UINT64_MAX) {
      uint64_t size = t->sizes[j];
      t->sizes[j] = UINT64_MAX; /* tombstone */
      return size;
    }
    j = (j + 1) & (t->cap - 1);
  }
  return 0;
}

static void remember(struct table *t, uint64_t key, uint64_t size) {
  pthread_mutex_lock(&st.mu);
  table_put(t, key, size);
  pthread_mutex_unlock(&st.mu);
}

static void give_back(struct table *t, uint64_t key) {
  pthread_mutex_lock(&st.mu);
  uint64_t size = table_take(t, key);
  pthread_mutex_unlock(&st.mu);
  if (size) uncharge(size);
}

/* ---- the wrapped entry points: each knows its real function ---- */
enum {
#define ENTRY(name, base, since, ptds) W_##name,
#include "entries.h"
#undef ENTRY
  W_COUNT
};

static void *real_fn[W_COUNT];

/* The driver's libraries, opened once (dlopen counts references: a second is harmless). */
static void *library(void **cached, const char *name) {
  void *handle = __atomic_load_n(cached, __ATOMIC_ACQUIRE);
  if (handle) return handle;
  handle = dlopen(name, RTLD_LAZY | RTLD_NOLOAD);
  if (!handle) handle = dlopen(name, RTLD_LAZY);
  if (handle) __atomic_store_n(cached, handle, __ATOMIC_RELEASE);
  return handle;
}
static void *cuda_handle, *nvml_handle;
static void *libcuda(void) { return library(&cuda_handle, "libcuda.so.1"); }
static void *libnvml(void) { return library(&nvml_handle, "libnvidia-ml.so.1"); }

static const char *const export_name[W_COUNT] = {
#define ENTRY(name, base, since, ptds) #name,
#include "entries.h"
#undef ENTRY
};

static void *real(int which) {
  void *fn = __atomic_load_n(&real_fn[which], __ATOMIC_ACQUIRE);
  if (fn) return fn;
  const char *name = export_name[which];
  void *lib = strncmp(name, "nvml", 4) == 0 ? libnvml() : libcuda();
  fn = lib ? real_dlsym(lib, name) : NULL;
  if (fn) __atomic_store_n(&real_fn[which], fn, __ATOMIC_RELEASE);
  return fn;
}

static void *wrapper(int which);

/* Records the driver's function behind a wrapper (never the wrapper itself). */
static void learn(int which, void *fn) {
  void *expected = NULL;
  if (fn && fn != wrapper(which))
    __atomic_compare_exchange_n(&real_fn[which], &expected, fn, 0, __ATOMIC_ACQ_REL,
                                      __ATOMIC_ACQUIRE);
}

#define REAL(name, type) ((type)real(W_##name))
#define NOT_FOUND 500 /* CUDA_ERROR_NOT_FOUND */

/* A device allocation: charge, call, and give back if the driver says no. */
#define ALLOCATE(name, key_out, table, bytes, call_args, ...)                 \
  typedef CUresult (*name##_t)(__VA_ARGS__);                                   \
  name##_t fn = REAL(name, name##_t);                                          \
  if (!fn) return NOT_FOUND;                                                   \
  if (!active()) return fn call_args;                                          \
  uint64_t need = (bytes);                                                     \
  if (!charge(need, #name, 0)) return CUDA_ERROR_OUT_OF_MEMORY;                \
  CUresult rc = fn call_args;                                                  \
  if (rc == CUDA_SUCCESS)                                                      \
    remember(&st.table, (uint64_t)(key_out), need);                            \
  else                                                                         \
    uncharge(need);                                                            \
  return rc;

#define RELEASE(name, table, key, call_args, ...)                              \
  typedef CUresult (*name##_t)(__VA_ARGS__);                                   \
  name##_t fn = REAL(name, name##_t);                                          \
  if (!fn) return NOT_FOUND;                                                   \
  CUresult rc = fn call_args;                                                  \
  if (rc == CUDA_SUCCESS && active()) give_back(&st.table, (uint64_t)(key));   \
  return rc;

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) {
  ALLOCATE(cuMemAlloc_v2, *dptr, pointers, bytes, (dptr, bytes), CUdeviceptr *, size_t)
}
EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned flags) {
  ALLOCATE(cuMemAllocManaged, *dptr, pointers, bytes, (dptr, bytes, flags), CUdeviceptr *,
           size_t, unsigned)
}
EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream stream) {
  ALLOCATE(cuMemAllocAsync, *dptr, pointers, bytes, (dptr, bytes, stream), CUdeviceptr *,
           size_t, CUstream)
}
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream stream) {
  ALLOCATE(cuMemAllocAsync_ptsz, *dptr, pointers, bytes, (dptr, bytes, stream), CUdeviceptr *,
           size_t, CUstream)
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                                        CUstream stream) {
  ALLOCATE(cuMemAllocFromPoolAsync, *dptr, pointers, bytes, (dptr, bytes, pool, stream),
           CUdeviceptr *, size_t, CUmemoryPool, CUstream)
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                                             CUstream stream) {
  ALLOCATE(cuMemAllocFromPoolAsync_ptsz, *dptr, pointers, bytes, (dptr, bytes, pool, stream),
           CUdeviceptr *, size_t, CUmemoryPool, CUstream)
}

/* A pitched allocation's size is the driver's pitch times the height: charge the width
 * first, then settle on what the driver chose. */
EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
                                   size_t height, unsigned element) {
  typedef CUresult (*fn_t)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
  fn_t fn = REAL(cuMemAllocPitch_v2, fn_t);
  if (!fn) return NOT_FOUND;
  if (!active()) return fn(dptr, pitch, width, height, element);
  uint64_t need = (uint64_t)width * height;
  if (!charge(need, "cuMemAllocPitch_v2", 0)) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult rc = fn(dptr, pitch, width, height, element);
  if (rc != CUDA_SUCCESS) {
    uncharge(need);
    return rc;
  }
  uint64_t took = (uint64_t)*pitch * height;
  if (took > need) charge(took - need, "cuMemAllocPitch_v2", 1);
  remember(&st.pointers, *dptr, took > need ? took : need);
  return rc;
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
  RELEASE(cuMemFree_v2, pointers, dptr, (dptr), CUdeviceptr)
}
EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  RELEASE(cuMemFreeAsync, pointers, dptr, (dptr, stream), CUdeviceptr, CUstream)
}
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
  RELEASE(cuMemFreeAsync_ptsz, pointers, dptr, (dptr, stream), CUdeviceptr, CUstream)
}

/* Virtual memory management: the physical allocation is what takes device memory. */
EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t bytes,
                            const CUmemAllocationProp *prop, unsigned long long flags) {
  typedef CUresult (*fn_t)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                           unsigned long long);
  fn_t fn = REAL(cuMemCreate, fn_t);
  if (!fn) return NOT_FOUND;
  if (!active() || !prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return fn(handle, bytes, prop, flags);
  if (!charge(bytes, "cuMemCreate", 0)) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult rc = fn(handle, bytes, prop, flags);
  if (rc == CUDA_SUCCESS)
    remember(&st.handles, *handle, bytes);
  else
    uncharge(bytes);
  return rc;
}
EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  RELEASE(cuMemRelease, handles, handle, (handle), CUmemGenericAllocationHandle)
}

/* Arrays: the descriptor's bytes, rounded up to 2 MiB as the driver lays them out. */
static uint64_t element_bytes(int format) {
  switch (format) {
    case 0x01: case 0x08: return 1;             /* (UN)SIGNED_INT8 */
    case 0x02: case 0x09: case 0x10: return 2;  /* (UN)SIGNED_INT16, HALF */
    default: return 4;                          /* 32-bit and every other format: at most */
  }
}
static uint64_t array_bytes(size_t w, size_t h, size_t d, int format, unsigned channels) {
  uint64_t bytes = (uint64_t)w * (h ? h : 1) * (d ? d : 1) * element_bytes(format) *
                   (channels ? channels : 1);
  const uint64_t granule = 2u << 20;
  return (bytes + granule - 1) / granule * granule;
}

EXPORT CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *desc) {
  ALLOCATE(cuArrayCreate_v2, *array, arrays,
           desc ? array_bytes(desc->Width, desc->Height, 1, desc->Format, desc->NumChannels) : 0,
           (array, desc), CUarray *, const CUDA_ARRAY_DESCRIPTOR *)
}
EXPORT CUresult cuArray3DCreate_v2(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
  ALLOCATE(cuArray3DCreate_v2, *array, arrays,
           desc ? array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format,
                              desc->NumChannels) : 0,
           (array, desc), CUarray *, const CUDA_ARRAY3D_DESCRIPTOR *)
}
EXPORT CUresult cuArrayDestroy(CUarray array) {
  RELEASE(cuArrayDestroy, arrays, (uintptr_t)array, (array), CUarray)
}
/* A mipmapped array's levels add up to at most 4/3 of its base level. */
EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                       unsigned levels) {
  ALLOCATE(cuMipmappedArrayCreate, *array, arrays,
           desc ? array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format,
                              desc->NumChannels) / 3 * 4 : 0,
           (array, desc, levels), CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned)
}
EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray array) {
  RELEASE(cuMipmappedArrayDestroy, arrays, (uintptr_t)array, (array), CUmipmappedArray)
}

/* ---- what the pod sees ---- */
static uint64_t shown_free(uint64_t really_free) {
  uint64_t used = pod_used();
  uint64_t left = used < st.limit ? st.limit - used : 0;
  return left < really_free ? left : really_free;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
  typedef CUresult (*fn_t)(size_t *, size_t *);
  fn_t fn = REAL(cuMemGetInfo_v2, fn_t);
  if (!fn) return NOT_FOUND;
  CUresult rc = fn(free_bytes, total_bytes);
  if (rc != CUDA_SUCCESS || !active()) return rc;
  if (free_bytes) *free_bytes = shown_free(*free_bytes);
  if (total_bytes && *total_bytes > st.limit) *total_bytes = st.limit;
  return rc;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device) {
  typedef CUresult (*fn_t)(size_t *, CUdevice);
  fn_t fn = REAL(cuDeviceTotalMem_v2, fn_t);
  if (!fn) return NOT_FOUND;
  CUresult rc = fn(bytes, device);
  if (rc == CUDA_SUCCESS && active() && bytes && *bytes > st.limit) *bytes = st.limit;
  return rc;
}

static void show_nvml(unsigned long long *total, unsigned long long *free_bytes,
                      unsigned long long *used) {
  uint64_t pod = pod_used();
  if (*total > st.limit) *total = st.limit;
  uint64_t left = pod < *total ? *total - pod : 0;
  if (*free_bytes > left) *free_bytes = left;
  *used = pod;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
  typedef nvmlReturn_t (*fn_t)(nvmlDevice_t, nvmlMemory_t *);
  fn_t fn = REAL(nvmlDeviceGetMemoryInfo, fn_t);
  if (!fn) return 3; /* NVML_ERROR_NOT_SUPPORTED */
  nvmlReturn_t rc = fn(device, memory);
  if (rc == NVML_SUCCESS && memory && active())
    show_nvml(&memory->total, &memory->free, &memory->used);
  return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
  typedef nvmlReturn_t (*fn_t)(nvmlDevice_t, nvmlMemory_v2_t *);
  fn_t fn = REAL(nvmlDeviceGetMemoryInfo_v2, fn_t);
  if (!fn) return 3;
  nvmlReturn_t rc = fn(device, memory);
  if (rc == NVML_SUCCESS && memory && active()) {
    show_nvml(&memory->total, &memory->free, &memory->used);
    memory->reserved = 0;
  }
  return rc;
}

/* ---- contexts: what the driver takes for one, read from NVML around its creation ---- */
typedef struct {
  unsigned char bytes[16];
} CUuuid;

static int nvml_used(CUdevice device, uint64_t *used) {
  typedef CUresult (*uuid_t)(CUuuid *, CUdevice);
  typedef nvmlReturn_t (*init_t)(void);
  typedef nvmlReturn_t (*by_uuid_t)(const char *, nvmlDevice_t *);
  typedef nvmlReturn_t (*info_t)(nvmlDevice_t, nvmlMemory_t *);
  void *cuda = libcuda(), *nvml = libnvml();
  if (!cuda || !nvml) return 0;
  uuid_t get_uuid = (uuid_t)real_dlsym(cuda, "cuDeviceGetUuid_v2");
  if (!get_uuid) get_uuid = (uuid_t)real_dlsym(cuda, "cuDeviceGetUuid");
  init_t init = (init_t)real_dlsym(nvml, "nvmlInit_v2");
  by_uuid_t by_uuid = (by_uuid_t)real_dlsym(nvml, "nvmlDeviceGetHandleByUUID");
  info_t info = (info_t)real(W_nvmlDeviceGetMemoryInfo);
  CUuuid id;
  if (!get_uuid || !init || !by_uuid || !info || get_uuid(&id, device) != CUDA_SUCCESS ||
      init() != NVML_SUCCESS)
    return 0;
  char text[64];
  const unsigned char *b = id.bytes;
  snprintf(text, sizeof text,
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
           b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12],
           b[13], b[14], b[15]);
  nvmlDevice_t handle;
  nvmlMemory_t memory;
  if (by_uuid(text, &handle) != NVML_SUCCESS || info(handle, &memory) != NVML_SUCCESS) return 0;
  *used = memory.used;
  return 1;
}

static int context_first(CUdevice device) {
  if (device < 0 || device >= MAX_DEVICES) return 0;
  pthread_mutex_lock(&st.mu);
  int first = !st.context_charged[device];
  st.context_charged[device] = 1;
  pthread_mutex_unlock(&st.mu);
  return first;
}

static void context_forget(CUdevice device) {
  pthread_mutex_lock(&st.mu);
  st.context_charged[device] = 0;
  pthread_mutex_unlock(&st.mu);
}

#define WITH_CONTEXT_CHARGE(device, call)                                             \
  if (!active() || !context_first(device)) return call;                               \
  uint64_t before = 0, after = 0;                                                      \
  int measured = nvml_used(device, &before);                                          \
  CUresult rc = call;                                                                  \
  if (rc == CUDA_SUCCESS && measured && nvml_used(device, &after) && after > before) \
    charge(after - before, "the CUDA context", 1);                                    \
  if (rc != CUDA_SUCCESS) context_forget(device);                                     \
  return rc;

EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice device) {
  typedef CUresult (*fn_t)(CUcontext *, CUdevice);
  fn_t fn = REAL(cuDevicePrimaryCtxRetain, fn_t);
  if (!fn) return NOT_FOUND;
  WITH_CONTEXT_CHARGE(device, fn(ctx, device))
}
EXPORT CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned flags, CUdevice device) {
  typedef CUresult (*fn_t)(CUcontext *, unsigned, CUdevice);
  fn_t fn = REAL(cuCtxCreate_v2, fn_t);
  if (!fn) return NOT_FOUND;
  WITH_CONTEXT_CHARGE(device, fn(ctx, flags, device))
}
EXPORT CUresult cuCtxCreate_v3(CUcontext *ctx, void *params, int count, unsigned flags,
                               CUdevice device) {
  typedef CUresult (*fn_t)(CUcontext *, void *, int, unsigned, CUdevice);
  fn_t fn = REAL(cuCtxCreate_v3, fn_t);
  if (!fn) return NOT_FOUND;
  WITH_CONTEXT_CHARGE(device, fn(ctx, params, count, flags, device))
}
EXPORT CUresult cuCtxCreate_v4(CUcontext *ctx, void *params, unsigned flags, CUdevice device) {
  typedef CUresult (*fn_t)(CUcontext *, void *, unsigned, CUdevice);
  fn_t fn = REAL(cuCtxCreate_v4, fn_t);
  if (!fn) return NOT_FOUND;
  WITH_CONTEXT_CHARGE(device, fn(ctx, params, flags, device))
}

/* ---- how applications find the driver's functions ---- */
static const char *const base_name[W_COUNT] = {
#define ENTRY(name, base, since, ptds) base,
#include "entries.h"
#undef ENTRY
};
static const int since_version[W_COUNT] = {
#define ENTRY(name, base, since, ptds) since,
#include "entries.h"
#undef ENTRY
};
static const int per_thread[W_COUNT] = {
#define ENTRY(name, base, since, ptds) ptds,
#include "entries.h"
#undef ENTRY
};

UNINSTRUMENTED static int by_export(const char *name) {
  if (!name || (strncmp(name, "cu", 2) != 0 && strncmp(name, "nvml", 4) != 0)) return -1;
  for (int i = 0; i < W_COUNT; i++)
    if (strcmp(export_name[i], name) == 0) return i;
  return -1;
}

/* Which wrapper stands for the driver's answer to cuGetProcAddress(symbol, version,
 * flags): the entry whose exported function the driver handed out; failing that (a
 * driver that answers with internal addresses), the driver's documented versioning,
 * where every ABI of the name has one signature. */
static int by_address(const char *symbol, void *fn) {
  void *lib = libcuda();
  for (int i = 0; lib && i < W_COUNT; i++)
    if (strcmp(base_name[i], symbol) == 0 && real_dlsym(lib, export_name[i]) == fn) return i;
  return -1;
}

static int by_version(const char *symbol, int version, unsigned long long flags) {
  if (strcmp(symbol, "cuCtxCreate") == 0) return -1; /* three signatures: address only */
  int best = -1, best_score = -1, ptds = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  for (int i = 0; i < W_COUNT; i++) {
    if (strcmp(base_name[i], symbol) != 0 || since_version[i] > version) continue;
    if (per_thread[i] && !ptds) continue;
    int score = since_version[i] * 2 + per_thread[i];
    if (score > best_score) best = i, best_score = score;
  }
  return best;
}

typedef CUresult (*gpa_t)(const char *, void **, int, unsigned long long);
typedef CUresult (*gpa2_t)(const char *, void **, int, unsigned long long,
                           CUdriverProcAddressQueryResult *);

static int debugging(void) {
  const char *debug = getenv("GPUPACK_CUDA_DEBUG");
  return debug && strcmp(debug, "1") == 0;
}

static void swap_in(const char *symbol, void **pfn, int version, unsigned long long flags) {
  if (!*pfn || strncmp(symbol, "cu", 2) != 0) return;
  int known = 0;
  for (int i = 0; i < W_COUNT && !known; i++) known = strcmp(base_name[i], symbol) == 0;
  if (!known) return;
  int which = by_address(symbol, *pfn);
  const char *how = "by address";
  if (which < 0) which = by_version(symbol, version, flags), how = "by version";
  if (debugging())
    say("cuGetProcAddress(%s, %d, %llu): %s %s", symbol, version, flags,
        which < 0 ? "left alone" : export_name[which], which < 0 ? "" : how);
  if (which < 0) return;
  learn(which, *pfn);
  *pfn = wrapper(which);
}

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                 unsigned long long flags) {
  gpa_t fn = REAL(cuGetProcAddress, gpa_t);
  if (!fn) return NOT_FOUND;
  CUresult rc = fn(symbol, pfn, version, flags);
  if (rc == CUDA_SUCCESS && symbol && pfn) swap_in(symbol, pfn, version, flags);
  return rc;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                    unsigned long long flags,
                                    CUdriverProcAddressQueryResult *status) {
  gpa2_t fn = REAL(cuGetProcAddress_v2, gpa2_t);
  if (!fn) return NOT_FOUND;
  CUresult rc = fn(symbol, pfn, version, flags, status);
  if (rc == CUDA_SUCCESS && symbol && pfn) swap_in(symbol, pfn, version, flags);
  return rc;
}

/* Every name we do not wrap goes to glibc's dlsym as a tail call, so the return address
 * it reads (RTLD_NEXT is resolved from it) is our caller's: allocators and sanitizers
 * that look their neighbours up while they start must never notice us. Not instrumented
 * by the sanitizers, which would stop the compiler making it a jump. */
UNINSTRUMENTED EXPORT void *dlsym(void *handle, const char *name) {
  dlsym_fn fn = __atomic_load_n(&real_dlsym_fn, __ATOMIC_ACQUIRE);
  if (!fn) {
    real_dlsym(NULL, NULL); /* resolves it; a lookup of nothing finds nothing */
    fn = __atomic_load_n(&real_dlsym_fn, __ATOMIC_ACQUIRE);
  }
  int which = by_export(name);
  if (which < 0 || !fn) return fn ? fn(handle, name) : NULL;
  void *found = handle == RTLD_NEXT ? next_after(__builtin_return_address(0), name)
                                    : fn(handle, name);
  if (!found) return NULL;
  learn(which, found);
  return wrapper(which);
}

static void *wrapper(int which) {
  switch (which) {
#define ENTRY(name, base, since, ptds) \
  case W_##name:                       \
    return (void *)&name;
#include "entries.h"
#undef ENTRY
    default:
      return NULL;
  }
}

/* Memory a process held goes back with the process; a fork child starts afresh. */
static void forked_child(void) {
  st.mu = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
}

__attribute__((constructor)) static void loaded(void) {
  pthread_atfork(NULL, NULL, forked_child);
}
