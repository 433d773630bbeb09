/*
 * Drives the CUDA driver API the ways applications do, for the shim's tests:
 *   probe MODE OP...
 * MODE: linked (calls the driver's exported names), dlsym (dlopen + dlsym, as XLA and
 * ctypes do), gpa or gpa-ptds (cuGetProcAddress_v2 for every name, as the CUDA runtime
 * does). OPs, in order, one line out each:
 *   alloc:N managed:N async:N pool:N pitch:W:H create:N hostcreate:N array:W:H
 *   array3d:W:H:D mipmap:W:H:D   (each pushes what it made; free pops and frees it)
 *   free info total ctx unwrapped peak hold hammer:THREADS:ROUNDS:BYTES
 *   bench:PAIRS:BYTES  (allocation and free pairs a second)
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct { size_t Width, Height; int Format; unsigned NumChannels; } ARRAY;
typedef struct { size_t Width, Height, Depth; int Format; unsigned NumChannels, Flags; } ARRAY3D;
typedef struct { int type, requested; struct { int type, id; } location; void *meta; unsigned char flags[8]; } PROP;

CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(void **, int);
CUresult cuCtxSetCurrent(void *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemAllocManaged(CUdeviceptr *, size_t, unsigned);
CUresult cuMemAllocAsync(CUdeviceptr *, size_t, void *);
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *, size_t, void *, void *);
CUresult cuMemAllocPitch_v2(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuMemFreeAsync(CUdeviceptr, void *);
CUresult cuMemCreate(unsigned long long *, size_t, const PROP *, unsigned long long);
CUresult cuMemRelease(unsigned long long);
CUresult cuArrayCreate_v2(void **, const ARRAY *);
CUresult cuArray3DCreate_v2(void **, const ARRAY3D *);
CUresult cuArrayDestroy(void *);
CUresult cuMipmappedArrayCreate(void **, const ARRAY3D *, unsigned);
CUresult cuMipmappedArrayDestroy(void *);
CUresult cuMemGetInfo_v2(size_t *, size_t *);
CUresult cuDeviceTotalMem_v2(size_t *, int);
CUresult cuCtxSynchronize(void);
CUresult cuStreamBeginCapture_v2(void *, int);
CUresult cuGraphLaunch(void *, void *);
CUresult cuGetProcAddress_v2(const char *, void **, int, unsigned long long, int *);

static struct {
  CUresult (*init)(unsigned);
  CUresult (*retain)(void **, int);
  CUresult (*set_current)(void *);
  CUresult (*alloc)(CUdeviceptr *, size_t);
  CUresult (*managed)(CUdeviceptr *, size_t, unsigned);
  CUresult (*async)(CUdeviceptr *, size_t, void *);
  CUresult (*pool)(CUdeviceptr *, size_t, void *, void *);
  CUresult (*pitch)(CUdeviceptr *, size_t *, size_t, size_t, unsigned);
  CUresult (*free)(CUdeviceptr);
  CUresult (*free_async)(CUdeviceptr, void *);
  CUresult (*create)(unsigned long long *, size_t, const PROP *, unsigned long long);
  CUresult (*release)(unsigned long long);
  CUresult (*array)(void **, const ARRAY *);
  CUresult (*array3d)(void **, const ARRAY3D *);
  CUresult (*array_destroy)(void *);
  CUresult (*mipmap)(void **, const ARRAY3D *, unsigned);
  CUresult (*mipmap_destroy)(void *);
  CUresult (*info)(size_t *, size_t *);
  CUresult (*total)(size_t *, int);
  CUresult (*sync)(void);
  CUresult (*capture)(void *, int);
  CUresult (*launch)(void *, void *);
} cu;

static const struct { const char *exported, *base; size_t offset; } names[] = {
#define N(field, exported, base) {exported, base, __builtin_offsetof(__typeof__(cu), field)},
    N(init, "cuInit", "cuInit") N(retain, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain")
    N(set_current, "cuCtxSetCurrent", "cuCtxSetCurrent")
    N(alloc, "cuMemAlloc_v2", "cuMemAlloc") N(managed, "cuMemAllocManaged", "cuMemAllocManaged")
    N(async, "cuMemAllocAsync", "cuMemAllocAsync") N(pool, "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync")
    N(pitch, "cuMemAllocPitch_v2", "cuMemAllocPitch") N(free, "cuMemFree_v2", "cuMemFree")
    N(free_async, "cuMemFreeAsync", "cuMemFreeAsync") N(create, "cuMemCreate", "cuMemCreate")
    N(release, "cuMemRelease", "cuMemRelease") N(array, "cuArrayCreate_v2", "cuArrayCreate")
    N(array3d, "cuArray3DCreate_v2", "cuArray3DCreate") N(array_destroy, "cuArrayDestroy", "cuArrayDestroy")
    N(mipmap, "cuMipmappedArrayCreate", "cuMipmappedArrayCreate")
    N(mipmap_destroy, "cuMipmappedArrayDestroy", "cuMipmappedArrayDestroy")
    N(info, "cuMemGetInfo_v2", "cuMemGetInfo") N(total, "cuDeviceTotalMem_v2", "cuDeviceTotalMem")
    N(sync, "cuCtxSynchronize", "cuCtxSynchronize") N(capture, "cuStreamBeginCapture_v2", "cuStreamBeginCapture")
    N(launch, "cuGraphLaunch", "cuGraphLaunch")
#undef N
};

static void linked(void) {
  cu.init = cuInit, cu.retain = cuDevicePrimaryCtxRetain, cu.set_current = cuCtxSetCurrent, cu.alloc = cuMemAlloc_v2;
  cu.managed = cuMemAllocManaged, cu.async = cuMemAllocAsync, cu.pool = cuMemAllocFromPoolAsync;
  cu.pitch = cuMemAllocPitch_v2, cu.free = cuMemFree_v2, cu.free_async = cuMemFreeAsync;
  cu.create = cuMemCreate, cu.release = cuMemRelease, cu.array = cuArrayCreate_v2;
  cu.array3d = cuArray3DCreate_v2, cu.array_destroy = cuArrayDestroy;
  cu.mipmap = cuMipmappedArrayCreate, cu.mipmap_destroy = cuMipmappedArrayDestroy;
  cu.info = cuMemGetInfo_v2, cu.total = cuDeviceTotalMem_v2, cu.sync = cuCtxSynchronize;
  cu.capture = cuStreamBeginCapture_v2, cu.launch = cuGraphLaunch;
}

static int resolve(const char *mode) {
  if (strcmp(mode, "linked") == 0) return linked(), 1;
  void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) return fprintf(stderr, "dlopen: %s\n", dlerror()), 0;
  CUresult (*gpa)(const char *, void **, int, unsigned long long, int *) = NULL;
  if (strncmp(mode, "gpa", 3) == 0) {
    *(void **)&gpa = dlsym(lib, "cuGetProcAddress_v2");
    if (!gpa) return fprintf(stderr, "no cuGetProcAddress_v2\n"), 0;
  }
  unsigned long long flags = strcmp(mode, "gpa-ptds") == 0 ? 2 : 0;
  for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
    void *fn = NULL;
    if (gpa) {
      int status;
      if (gpa(names[i].base, &fn, 13000, flags, &status)) fn = NULL;
    } else {
      fn = dlsym(lib, names[i].exported);
    }
    if (!fn) return fprintf(stderr, "cannot resolve %s\n", names[i].base), 0;
    *(void **)((char *)&cu + names[i].offset) = fn;
  }
  return 1;
}

struct made { char kind; unsigned long long key; };
static struct made stack[4096];
static int depth;

static void push(char kind, unsigned long long key) { if (depth < 4096) stack[depth++] = (struct made){kind, key}; }

static CUresult pop(void) {
  if (!depth) return -1;
  struct made m = stack[--depth];
  switch (m.kind) {
    case 'm': return cu.free(m.key);
    case 'a': return cu.free_async(m.key, NULL);
    case 'h': return cu.release(m.key);
    case 'r': return cu.array_destroy((void *)(uintptr_t)m.key);
    case 'p': return cu.mipmap_destroy((void *)(uintptr_t)m.key);
  }
  return -1;
}

static uint64_t limit, held, worst;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static size_t hammer_bytes;
static int hammer_rounds;
static long refused, granted;

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
      cu.free(p);
    }
  }
  return NULL;
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
    unsigned long long a = 0, b = 0, c = 0;
    CUresult rc = 0;
    CUdeviceptr p = 0;
    if (sscanf(op, "alloc:%llu", &a) == 1) { rc = cu.alloc(&p, a); if (!rc) push('m', p); }
    else if (sscanf(op, "managed:%llu", &a) == 1) { rc = cu.managed(&p, a, 1); if (!rc) push('m', p); }
    else if (sscanf(op, "async:%llu", &a) == 1) { rc = cu.async(&p, a, NULL); if (!rc) push('a', p); }
    else if (sscanf(op, "pool:%llu", &a) == 1) { rc = cu.pool(&p, a, (void *)0x1, NULL); if (!rc) push('a', p); }
    else if (sscanf(op, "pitch:%llu:%llu", &a, &b) == 2) {
      size_t pitch;
      rc = cu.pitch(&p, &pitch, a, b, 4);
      if (!rc) push('m', p);
    } else if (sscanf(op, "create:%llu", &a) == 1 || sscanf(op, "hostcreate:%llu", &a) == 1) {
      PROP prop = {.type = 1, .location = {op[0] == 'h' ? 2 : 1, 0}};
      unsigned long long h;
      rc = cu.create(&h, a, &prop, 0);
      if (!rc) push('h', h);
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
    } else if (strcmp(op, "free") == 0) rc = pop();
    else if (strcmp(op, "ctx") == 0) {
      rc = cu.retain(&ctx, 0);
      if (!rc) rc = cu.set_current(ctx);
    }
    else if (strcmp(op, "info") == 0) {
      size_t f, t;
      rc = cu.info(&f, &t);
      printf("info rc=%d free=%zu total=%zu\n", rc, f, t);
      continue;
    } else if (strcmp(op, "total") == 0) {
      size_t t;
      rc = cu.total(&t, 0);
      printf("total rc=%d total=%zu\n", rc, t);
      continue;
    } else if (strcmp(op, "unwrapped") == 0) {
      rc = cu.capture(NULL, 0) | cu.launch(NULL, NULL) | cu.sync();
    } else if (strcmp(op, "peak") == 0) {
      void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
      uint64_t (*peak)(void) = NULL;
      if (lib) *(void **)&peak = dlsym(lib, "fake_device_peak");
      printf("peak bytes=%llu\n", peak ? (unsigned long long)peak() : 0ULL);
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
    } else if (sscanf(op, "hammer:%llu:%llu:%llu", &a, &b, &c) == 3) {
      pthread_t threads[64];
      hammer_rounds = (int)b, hammer_bytes = c;
      if (a > 64) a = 64;
      for (unsigned long long t = 0; t < a; t++) pthread_create(&threads[t], NULL, hammer, (void *)(uintptr_t)(t + 1));
      for (unsigned long long t = 0; t < a; t++) pthread_join(threads[t], NULL);
      printf("hammer granted=%ld refused=%ld worst=%llu limit=%llu\n", granted, refused,
             (unsigned long long)worst, (unsigned long long)limit);
      continue;
    } else {
      fprintf(stderr, "unknown op %s\n", op);
      return 2;
    }
    printf("%s rc=%d\n", op, rc);
  }
  return 0;
}
