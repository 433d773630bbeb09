/*
 * A fake CUDA driver (libcuda.so.1) for the shim's tests: devices, contexts, memory
 * queries, limits, launches and cuGetProcAddress (here); allocations, pools and VMM
 * (fake_memory.c); graphs, captures and modules (fake_graphs.c). See fake_cuda.h.
 *
 * FAKE_CUDA_STATE: a file shared by every process of a test (the devices: their totals
 * and each live process's usage; a dead process's memory is freed, as the driver does).
 * FAKE_CUDA_TOTAL: each device's bytes (default 80 GiB); FAKE_CUDA_CONTEXT: what a
 * context takes (default 300 MiB); FAKE_CUDA_DEVICES: how many (default 1, at most 4);
 * FAKE_CUDA_CONTEXT_DELAY_MS: how long making a context takes (default none).
 */
#include "fake_cuda.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

pthread_mutex_t fake_mu = PTHREAD_MUTEX_INITIALIZER;

void called(const char *name) {
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

/* ---- maps ---- */
static size_t bucket_of(uint64_t key) { return (size_t)((key * 0x9E3779B97F4A7C15ULL) >> 52); }
void *map_get(struct map *m, uint64_t key) {
  for (struct entry *e = m->bucket[bucket_of(key)]; e; e = e->next)
    if (e->key == key) return e->value;
  return NULL;
}
void map_put(struct map *m, uint64_t key, void *value) {
  struct entry *e = malloc(sizeof *e);
  *e = (struct entry){key, value, m->bucket[bucket_of(key)]};
  m->bucket[bucket_of(key)] = e;
}
void *map_take(struct map *m, uint64_t key) {
  for (struct entry **at = &m->bucket[bucket_of(key)]; *at; at = &(*at)->next) {
    if ((*at)->key != key) continue;
    struct entry *e = *at;
    void *value = e->value;
    *at = e->next;
    free(e);
    return value;
  }
  return NULL;
}

/* ---- addresses and handles, reused as the real driver reuses them ---- */
#define FREED 4096
static struct { uint64_t address, region; } freed[FREED];
static int freed_count;
static uint64_t next_address = 0x7f0000000000ULL, next_handle = 0x1000;
static uint64_t freed_handles[FREED];
static int freed_handle_count;

uint64_t address_take(uint64_t bytes, uint64_t *region) {
  for (int i = freed_count - 1; i >= 0; i--) { /* the most recently freed that fits */
    if (freed[i].region < bytes) continue;
    uint64_t address = freed[i].address;
    *region = freed[i].region;
    freed[i] = freed[--freed_count];
    return address;
  }
  *region = (bytes + 4095) / 4096 * 4096;
  uint64_t address = next_address;
  next_address += *region + 4096;
  return address;
}
void address_give(uint64_t address, uint64_t region) {
  if (freed_count < FREED) freed[freed_count++].address = address, freed[freed_count - 1].region = region;
}
uint64_t handle_take(void) {
  return freed_handle_count ? freed_handles[--freed_handle_count] : next_handle++;
}
void handle_give(uint64_t handle) {
  if (freed_handle_count < FREED) freed_handles[freed_handle_count++] = handle;
}

/* ---- devices and contexts ---- */
#define CONTEXT_BASE 0x1000
static __thread int current = -1;
static unsigned char context_made[FAKE_MAX_DEVICES];

int current_device(void) { return current; }
static int device_or_first(void) { return current >= 0 ? current : 0; }

static CUresult context(int device) {
  if (device < 0 || device >= fake_devices()) return INVALID;
  pthread_mutex_lock(&fake_mu);
  int first = !context_made[device];
  context_made[device] = 1;
  pthread_mutex_unlock(&fake_mu);
  if (first) {
    fake_device_join(device);
    fake_device_take_anyway(device, fake_device_context_bytes());
    const char *delay = getenv("FAKE_CUDA_CONTEXT_DELAY_MS"); /* a slow start, for races */
    if (delay) usleep((useconds_t)strtoul(delay, NULL, 10) * 1000);
  }
  return OK;
}

CUresult cuInit(unsigned flags) { (void)flags; CALLED; return OK; }
CUresult cuDriverGetVersion(int *version) { CALLED; *version = 13000; return OK; }
CUresult cuDeviceGetCount(int *count) { CALLED; *count = fake_devices(); return OK; }
CUresult cuDeviceGet(int *device, int ordinal) {
  CALLED;
  *device = ordinal;
  return ordinal >= 0 && ordinal < fake_devices() ? OK : INVALID;
}
CUresult cuDeviceGetUuid(unsigned char *uuid, int device) {
  CALLED;
  for (int i = 0; i < 16; i++) uuid[i] = (unsigned char)(i + 16 * device);
  return device >= 0 && device < fake_devices() ? OK : INVALID;
}
CUresult cuDeviceGetUuid_v2(unsigned char *uuid, int device) { return cuDeviceGetUuid(uuid, device); }
CUresult cuDeviceGetAttribute(int *value, int attribute, int device) {
  CALLED;
  (void)device;
  *value = attribute == 16 ? 132 : attribute == 39 ? 2048 : 0; /* SMs, threads per SM */
  return OK;
}
CUresult cuDevicePrimaryCtxRetain(void **ctx, int device) {
  CALLED;
  *ctx = (void *)(uintptr_t)(CONTEXT_BASE + device);
  return context(device);
}
CUresult cuDevicePrimaryCtxRelease_v2(int device) { (void)device; CALLED; return OK; }
CUresult cuCtxCreate_v2(void **ctx, unsigned flags, int device) {
  CALLED;
  (void)flags;
  *ctx = (void *)(uintptr_t)(CONTEXT_BASE + device);
  current = device;
  return context(device);
}
CUresult cuCtxCreate(void **ctx, unsigned flags, int device) { return cuCtxCreate_v2(ctx, flags, device); }
CUresult cuCtxCreate_v4(void **ctx, void *params, unsigned flags, int device) {
  (void)params;
  return cuCtxCreate_v2(ctx, flags, device);
}
CUresult cuCtxSetCurrent(void *ctx) {
  CALLED;
  current = ctx ? (int)((uintptr_t)ctx - CONTEXT_BASE) : -1;
  return OK;
}
CUresult cuCtxGetDevice(int *device) {
  CALLED;
  if (current < 0) return INVALID_CONTEXT;
  *device = current;
  return OK;
}
CUresult cuCtxSynchronize(void) {
  CALLED;
  fake_clock_drain(device_or_first());
  synchronized();
  return OK;
}
CUresult cuCtxGetCurrent(void **ctx) {
  CALLED;
  *ctx = current < 0 ? NULL : (void *)(uintptr_t)(CONTEXT_BASE + current);
  return OK;
}
CUresult cuStreamCreate(void **stream, unsigned flags) {
  CALLED;
  (void)flags;
  pthread_mutex_lock(&fake_mu);
  *stream = (void *)(uintptr_t)handle_take();
  pthread_mutex_unlock(&fake_mu);
  return OK;
}
CUresult cuStreamSynchronize(void *stream) {
  CALLED;
  (void)stream;
  fake_clock_drain(device_or_first()); /* one queue per context: every stream's work */
  synchronized();
  return OK;
}
CUresult cuStreamSynchronize_ptsz(void *stream) { return cuStreamSynchronize(stream); }

/* ---- memory queries ---- */
CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
  CALLED;
  int device = device_or_first();
  uint64_t t = fake_device_total(device), used = fake_device_used(device);
  *total = t;
  *free_bytes = used < t ? t - used : 0;
  return OK;
}
CUresult cuMemGetInfo(unsigned *free_bytes, unsigned *total) {
  size_t f, t;
  cuMemGetInfo_v2(&f, &t);
  *free_bytes = f > 0xffffffffu ? 0xffffffffu : (unsigned)f;
  *total = t > 0xffffffffu ? 0xffffffffu : (unsigned)t;
  return OK;
}
CUresult cuDeviceTotalMem_v2(size_t *bytes, int device) {
  CALLED;
  *bytes = fake_device_total(device);
  return OK;
}
CUresult cuDeviceTotalMem(unsigned *bytes, int device) {
  CALLED;
  uint64_t t = fake_device_total(device);
  *bytes = t > 0xffffffffu ? 0xffffffffu : (unsigned)t;
  return OK;
}

/* ---- limits: the heap, the printf FIFO and the stack, reserved at the next launch ---- */
static const uint64_t default_limit[3] = {1024, 1 << 20, 8 << 20};
static uint64_t limit_value[FAKE_MAX_DEVICES][3], limit_reserved[FAKE_MAX_DEVICES];
static int limit_set[FAKE_MAX_DEVICES][3];

static uint64_t limit_of(int device, int limit) {
  return limit_set[device][limit] ? limit_value[device][limit] : default_limit[limit];
}
CUresult cuCtxSetLimit(int limit, size_t value) {
  CALLED;
  if (limit < 0 || limit > 2 || current < 0) return INVALID;
  pthread_mutex_lock(&fake_mu);
  limit_value[current][limit] = value, limit_set[current][limit] = 1;
  pthread_mutex_unlock(&fake_mu);
  return OK;
}
CUresult cuCtxGetLimit(size_t *value, int limit) {
  CALLED;
  if (limit < 0 || limit > 2 || current < 0) return INVALID;
  *value = limit_of(current, limit);
  return OK;
}
int launched(int device) {
  if (device < 0) return 1;
  pthread_mutex_lock(&fake_mu);
  uint64_t want = 0;
  for (int limit = 0; limit < 3; limit++) {
    uint64_t value = limit_of(device, limit), base = default_limit[limit];
    uint64_t extra = value > base ? value - base : 0;
    want += limit == 0 ? extra * 132 * 2048 : extra;
  }
  uint64_t have = limit_reserved[device];
  pthread_mutex_unlock(&fake_mu);
  if (want > have && !fake_device_take(device, want - have)) return 0;
  if (want < have) fake_device_give(device, have - want);
  pthread_mutex_lock(&fake_mu);
  limit_reserved[device] = want;
  pthread_mutex_unlock(&fake_mu);
  return 1;
}
CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
  CALLED;
  (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shared;
  (void)stream, (void)params, (void)extra;
  if (!launched(current)) return OOM;
  fake_clock_launch(device_or_first());
  return OK;
}
CUresult cuLaunchKernel_ptsz(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                             unsigned by, unsigned bz, unsigned shared, void *stream,
                             void **params, void **extra) {
  return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra);
}
CUresult cuLaunchCooperativeKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                   unsigned by, unsigned bz, unsigned shared, void *stream,
                                   void **params) {
  return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, NULL);
}
CUresult cuLaunchCooperativeKernel_ptsz(void *f, unsigned gx, unsigned gy, unsigned gz,
                                        unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                        void *stream, void **params) {
  return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, NULL);
}
CUresult cuLaunchKernelEx(const LAUNCH_CONFIG *config, void *f, void **params,
                          void **extra) {
  if (!config) return INVALID;
  return cuLaunchKernel(f, config->grid[0], config->grid[1], config->grid[2], config->block[0],
                        config->block[1], config->block[2], config->shared, config->stream,
                        params, extra);
}
CUresult cuLaunchKernelEx_ptsz(const LAUNCH_CONFIG *config, void *f, void **params,
                               void **extra) {
  return cuLaunchKernelEx(config, f, params, extra);
}
