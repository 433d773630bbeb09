/*
 * A fake CUDA driver (libcuda.so.1) for the shim's tests: the entry points the shim
 * wraps and a few it must leave alone, with real bookkeeping of one device's memory.
 *
 * FAKE_CUDA_STATE: a file shared by every process of a test (the device: its total and
 *   each live process's usage; a dead process's memory is freed, as the driver does).
 * FAKE_CUDA_TOTAL: the device's bytes (default 80 GiB); FAKE_CUDA_CONTEXT: what a
 *   context takes (default 300 MiB). FAKE_CUDA_LOG: a file each call appends its name to.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_device.h"

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
typedef struct { size_t Width, Height; int Format; unsigned NumChannels; } ARRAY;
typedef struct { size_t Width, Height, Depth; int Format; unsigned NumChannels, Flags; } ARRAY3D;
typedef struct { int type, requested; struct { int type, id; } location; } PROP;

#define OK 0
#define OOM 2
#define INVALID 1
#define NOT_FOUND 500

static void called(const char *name) {
  const char *path = getenv("FAKE_CUDA_LOG");
  if (!path) return;
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return;
  char line[128];
  int n = snprintf(line, sizeof line, "%s\n", name);
  ssize_t ignored = write(fd, line, (size_t)n);
  (void)ignored;
  close(fd);
}

#define CALLED called(__func__)

/* what this process holds: allocations by key, for the frees */
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
#define HELD 65536
static struct { uint64_t key, size; } held[HELD];
static uint64_t next_address = 0x7f0000000000ULL;
static int context_made;

static CUresult take(unsigned long long *key, uint64_t size) {
  if (!fake_device_take(size)) return OOM;
  pthread_mutex_lock(&mu);
  *key = next_address;
  next_address += (size + 4095) / 4096 * 4096 + 4096;
  int stored = 0;
  for (int i = 0; i < HELD && !stored; i++)
    if (!held[i].key) held[i].key = *key, held[i].size = size, stored = 1;
  pthread_mutex_unlock(&mu);
  return OK;
}

static CUresult give(uint64_t key) {
  uint64_t size = 0;
  int found = 0;
  pthread_mutex_lock(&mu);
  for (int i = 0; i < HELD && !found; i++)
    if (key && held[i].key == key) size = held[i].size, held[i].key = 0, found = 1;
  pthread_mutex_unlock(&mu);
  if (!found) return INVALID;
  fake_device_give(size);
  return OK;
}

static CUresult context(void) {
  pthread_mutex_lock(&mu);
  int first = !context_made;
  context_made = 1;
  pthread_mutex_unlock(&mu);
  if (first) fake_device_take_anyway(fake_device_context_bytes());
  return OK;
}

CUresult cuInit(unsigned flags) { (void)flags; CALLED; return OK; }
CUresult cuDriverGetVersion(int *version) { CALLED; *version = 13000; return OK; }
CUresult cuDeviceGetCount(int *count) { CALLED; *count = 1; return OK; }
CUresult cuDeviceGet(int *device, int ordinal) { CALLED; *device = ordinal; return ordinal ? INVALID : OK; }
CUresult cuDeviceGetUuid(unsigned char *uuid, int device) {
  CALLED;
  for (int i = 0; i < 16; i++) uuid[i] = (unsigned char)i;
  return device ? INVALID : OK;
}
CUresult cuDeviceGetUuid_v2(unsigned char *uuid, int device) { return cuDeviceGetUuid(uuid, device); }
CUresult cuDevicePrimaryCtxRetain(void **ctx, int device) { CALLED; *ctx = (void *)0x1; (void)device; return context(); }
CUresult cuDevicePrimaryCtxRelease_v2(int device) { (void)device; CALLED; return OK; }
CUresult cuCtxCreate_v2(void **ctx, unsigned flags, int device) { CALLED; (void)flags; (void)device; *ctx = (void *)0x2; return context(); }
CUresult cuCtxCreate_v4(void **ctx, void *params, unsigned flags, int device) { CALLED; (void)params; (void)flags; (void)device; *ctx = (void *)0x2; return context(); }
CUresult cuCtxSynchronize(void) { CALLED; return OK; }
CUresult cuCtxSetCurrent(void *ctx) { CALLED; (void)ctx; return OK; }
CUresult cuStreamBeginCapture_v2(void *stream, int mode) { CALLED; (void)stream; (void)mode; return OK; }
CUresult cuGraphLaunch(void *graph, void *stream) { CALLED; (void)graph; (void)stream; return OK; }

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { CALLED; return take(p, n); }
CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned f) { CALLED; (void)f; return take(p, n); }
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, void *s) { CALLED; (void)s; return take(p, n); }
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, void *s) { CALLED; (void)s; return take(p, n); }
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, void *pool, void *s) { CALLED; (void)pool; (void)s; return take(p, n); }
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, void *pool, void *s) { CALLED; (void)pool; (void)s; return take(p, n); }
CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned e) {
  CALLED;
  (void)e;
  *pitch = (w + 511) / 512 * 512;
  return take(p, *pitch * h);
}
CUresult cuMemFree_v2(CUdeviceptr p) { CALLED; return give(p); }
CUresult cuMemFreeAsync(CUdeviceptr p, void *s) { CALLED; (void)s; return give(p); }
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, void *s) { CALLED; (void)s; return give(p); }
CUresult cuMemCreate(unsigned long long *h, size_t n, const PROP *prop, unsigned long long f) {
  CALLED;
  (void)f;
  if (!prop) return INVALID;
  if (prop->location.type != 1) { /* host memory: the device keeps nothing */
    pthread_mutex_lock(&mu);
    *h = next_address++;
    pthread_mutex_unlock(&mu);
    return OK;
  }
  return take(h, n);
}
CUresult cuMemRelease(unsigned long long h) { CALLED; give(h); return OK; }
static uint64_t array_size(size_t w, size_t h, size_t d, unsigned channels) {
  return (uint64_t)w * (h ? h : 1) * (d ? d : 1) * 4 * (channels ? channels : 1);
}
CUresult cuArrayCreate_v2(void **a, const ARRAY *d) {
  CALLED;
  unsigned long long key;
  CUresult rc = take(&key, array_size(d->Width, d->Height, 1, d->NumChannels));
  *a = (void *)(uintptr_t)key;
  return rc;
}
CUresult cuArray3DCreate_v2(void **a, const ARRAY3D *d) {
  CALLED;
  unsigned long long key;
  CUresult rc = take(&key, array_size(d->Width, d->Height, d->Depth, d->NumChannels));
  *a = (void *)(uintptr_t)key;
  return rc;
}
CUresult cuArrayDestroy(void *a) { CALLED; return give((uintptr_t)a); }
CUresult cuMipmappedArrayCreate(void **a, const ARRAY3D *d, unsigned levels) {
  CALLED;
  (void)levels;
  unsigned long long key;
  CUresult rc = take(&key, array_size(d->Width, d->Height, d->Depth, d->NumChannels));
  *a = (void *)(uintptr_t)key;
  return rc;
}
CUresult cuMipmappedArrayDestroy(void *a) { CALLED; return give((uintptr_t)a); }

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
  CALLED;
  uint64_t t = fake_device_total(), used = fake_device_used();
  *total = t;
  *free_bytes = used < t ? t - used : 0;
  return OK;
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, int device) { CALLED; (void)device; *bytes = fake_device_total(); return OK; }

/* The driver's own lookup: a name and the ABI version the caller was built for. */
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags);
static const struct { const char *name; int since, ptds; void *fn; } table[] = {
#define F(base, since, ptds, fn) {base, since, ptds, (void *)&fn},
    F("cuInit", 2000, 0, cuInit) F("cuDriverGetVersion", 2020, 0, cuDriverGetVersion)
    F("cuDeviceGet", 2000, 0, cuDeviceGet) F("cuDeviceGetCount", 2000, 0, cuDeviceGetCount)
    F("cuDeviceGetUuid", 9020, 0, cuDeviceGetUuid) F("cuDeviceGetUuid", 11040, 0, cuDeviceGetUuid_v2)
    F("cuDevicePrimaryCtxRetain", 7000, 0, cuDevicePrimaryCtxRetain)
    F("cuDevicePrimaryCtxRelease", 11000, 0, cuDevicePrimaryCtxRelease_v2)
    F("cuCtxCreate", 3020, 0, cuCtxCreate_v2) F("cuCtxCreate", 12050, 0, cuCtxCreate_v4)
    F("cuCtxSynchronize", 2000, 0, cuCtxSynchronize) F("cuCtxSetCurrent", 4000, 0, cuCtxSetCurrent)
    F("cuStreamBeginCapture", 10010, 0, cuStreamBeginCapture_v2) F("cuGraphLaunch", 10000, 0, cuGraphLaunch)
    F("cuMemAlloc", 3020, 0, cuMemAlloc_v2) F("cuMemAllocManaged", 6000, 0, cuMemAllocManaged)
    F("cuMemAllocAsync", 11020, 0, cuMemAllocAsync) F("cuMemAllocAsync", 11020, 1, cuMemAllocAsync_ptsz)
    F("cuMemAllocFromPoolAsync", 11020, 0, cuMemAllocFromPoolAsync)
    F("cuMemAllocFromPoolAsync", 11020, 1, cuMemAllocFromPoolAsync_ptsz)
    F("cuMemAllocPitch", 3020, 0, cuMemAllocPitch_v2) F("cuMemFree", 3020, 0, cuMemFree_v2)
    F("cuMemFreeAsync", 11020, 0, cuMemFreeAsync) F("cuMemFreeAsync", 11020, 1, cuMemFreeAsync_ptsz)
    F("cuMemCreate", 10020, 0, cuMemCreate) F("cuMemRelease", 10020, 0, cuMemRelease)
    F("cuArrayCreate", 3020, 0, cuArrayCreate_v2) F("cuArray3DCreate", 3020, 0, cuArray3DCreate_v2)
    F("cuArrayDestroy", 2000, 0, cuArrayDestroy)
    F("cuMipmappedArrayCreate", 5000, 0, cuMipmappedArrayCreate)
    F("cuMipmappedArrayDestroy", 5000, 0, cuMipmappedArrayDestroy)
    F("cuMemGetInfo", 3020, 0, cuMemGetInfo_v2) F("cuDeviceTotalMem", 3020, 0, cuDeviceTotalMem_v2)
    F("cuGetProcAddress", 11030, 0, cuGetProcAddress)
#undef F
};

static CUresult lookup(const char *symbol, void **pfn, int version, unsigned long long flags) {
  int best = -1, best_score = -1;
  for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
    if (strcmp(table[i].name, symbol) || table[i].since > version) continue;
    if (table[i].ptds && !(flags & 2)) continue;
    int score = table[i].since * 2 + table[i].ptds;
    if (score > best_score) best = (int)i, best_score = score;
  }
  *pfn = best < 0 ? NULL : table[best].fn;
  return best < 0 ? NOT_FOUND : OK;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status);
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags) {
  CALLED;
  if (strcmp(symbol, "cuGetProcAddress") == 0 && version >= 12000) {
    *pfn = (void *)&cuGetProcAddress_v2;
    return OK;
  }
  return lookup(symbol, pfn, version, flags);
}
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags, int *status) {
  CALLED;
  CUresult rc = strcmp(symbol, "cuGetProcAddress") == 0 && version >= 12000
                    ? (*pfn = (void *)&cuGetProcAddress_v2, OK)
                    : lookup(symbol, pfn, version, flags);
  if (status) *status = rc == OK ? 0 : 1;
  return rc;
}
