/* The fake driver's memory: linear allocations and arrays, stream-ordered pools, and the
 * virtual memory management API, each with the real driver's bookkeeping (fake_cuda.h). */
#include "fake_cuda.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- pools ---- */
#define MAX_POOLS 256
struct pool {
  int device, host, destroyed;
  uint64_t threshold, reserved, used;
};
static struct pool *all_pools[MAX_POOLS];
static int pool_count;
static struct map pools;
static struct pool *current_pools[FAKE_MAX_DEVICES], *default_pools[FAKE_MAX_DEVICES];

static struct pool *new_pool(int device, int host, uint64_t *handle) {
  struct pool *p = calloc(1, sizeof *p);
  p->device = device, p->host = host;
  *handle = handle_take();
  map_put(&pools, *handle, p);
  if (pool_count < MAX_POOLS) all_pools[pool_count++] = p;
  return p;
}

static struct pool *default_pool(int device, uint64_t *handle) {
  static uint64_t handles[FAKE_MAX_DEVICES];
  if (!default_pools[device]) default_pools[device] = new_pool(device, 0, &handles[device]);
  *handle = handles[device];
  return default_pools[device];
}

static int pool_take(struct pool *p, uint64_t bytes) {
  if (p->host) return 1;
  uint64_t spare = p->reserved - p->used;
  if (spare < bytes) {
    if (!fake_device_take(p->device, bytes - spare)) return 0;
    p->reserved += bytes - spare;
  }
  p->used += bytes;
  return 1;
}

static void pool_release_to(struct pool *p, uint64_t keep) {
  uint64_t target = p->used + keep;
  if (p->reserved > target) {
    fake_device_give(p->device, p->reserved - target);
    p->reserved = target;
  }
}

void synchronized(void) { /* each pool gives back what it keeps past its threshold */
  pthread_mutex_lock(&fake_mu);
  for (int i = 0; i < pool_count; i++)
    if (!all_pools[i]->host) pool_release_to(all_pools[i], all_pools[i]->threshold);
  pthread_mutex_unlock(&fake_mu);
}

/* ---- what each allocation holds ---- */
enum { PLAIN, POOLED, HOST };
struct allocation {
  int device, kind;
  uint64_t size, region;
  struct pool *pool;
};
static struct map pointers;
static uint64_t next_low = 0x10000000; /* for the 32-bit ABI */

static CUresult take(CUdeviceptr *key, uint64_t size, int kind, struct pool *p, int low) {
  int device = current_device() >= 0 ? current_device() : 0;
  pthread_mutex_lock(&fake_mu);
  if (p) device = p->device;
  int ok = kind == POOLED ? pool_take(p, size) : 1;
  pthread_mutex_unlock(&fake_mu);
  if (!ok || (kind == PLAIN && !fake_device_take(device, size))) return OOM;
  struct allocation *a = malloc(sizeof *a);
  *a = (struct allocation){device, kind, size, 0, p};
  pthread_mutex_lock(&fake_mu);
  if (low) {
    *key = next_low, next_low += (size + 4095) / 4096 * 4096 + 4096;
  } else {
    *key = address_take(size, &a->region);
  }
  map_put(&pointers, *key, a);
  pthread_mutex_unlock(&fake_mu);
  return OK;
}

static CUresult give(uint64_t key) {
  pthread_mutex_lock(&fake_mu);
  struct allocation *a = key ? map_take(&pointers, key) : NULL;
  if (a && a->kind == POOLED) a->pool->used -= a->size;
  if (a && a->region) address_give(key, a->region);
  pthread_mutex_unlock(&fake_mu);
  if (!a) return INVALID;
  if (a->kind == PLAIN) fake_device_give(a->device, a->size);
  free(a);
  return OK;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) { CALLED; return take(p, n, PLAIN, NULL, 0); }
CUresult cuMemAlloc(unsigned *p, unsigned n) {
  CALLED;
  CUdeviceptr key;
  CUresult rc = take(&key, n, PLAIN, NULL, 1);
  if (rc == OK) *p = (unsigned)key;
  return rc;
}
CUresult cuMemAllocManaged(CUdeviceptr *p, size_t n, unsigned flags) {
  CALLED;
  return take(p, n, flags & 2 ? HOST : PLAIN, NULL, 0); /* attached to the host: host memory */
}
CUresult cuMemAllocPitch_v2(CUdeviceptr *p, size_t *pitch, size_t w, size_t h, unsigned e) {
  CALLED;
  (void)e;
  *pitch = (w + 511) / 512 * 512;
  return take(p, *pitch * h, PLAIN, NULL, 0);
}
CUresult cuMemAllocPitch(unsigned *p, unsigned *pitch, unsigned w, unsigned h, unsigned e) {
  CALLED;
  (void)e;
  *pitch = (w + 511) / 512 * 512;
  CUdeviceptr key;
  CUresult rc = take(&key, (uint64_t)*pitch * h, PLAIN, NULL, 1);
  if (rc == OK) *p = (unsigned)key;
  return rc;
}
CUresult cuMemFree_v2(CUdeviceptr p) {
  CALLED;
  if (is_graph_memory(p)) return graph_memory_freed(p), OK;
  return give(p);
}
CUresult cuMemFree(unsigned p) { CALLED; return give(p); }

/* Arrays: width x height x depth x 4 bytes x channels. */
static uint64_t array_size(size_t w, size_t h, size_t d, unsigned channels) {
  return (uint64_t)w * (h ? h : 1) * (d ? d : 1) * 4 * (channels ? channels : 1);
}
#define MAKE_ARRAY(bytes)                              \
  CUdeviceptr key;                                        \
  CUresult rc = take(&key, (bytes), PLAIN, NULL, 0);   \
  *a = (void *)(uintptr_t)key;                         \
  return rc;
CUresult cuArrayCreate_v2(void **a, const ARRAY *d) {
  CALLED;
  MAKE_ARRAY(array_size(d->Width, d->Height, 1, d->NumChannels))
}
CUresult cuArrayCreate(void **a, const ARRAY_V1 *d) {
  CALLED;
  MAKE_ARRAY(array_size(d->Width, d->Height, 1, d->NumChannels))
}
CUresult cuArray3DCreate_v2(void **a, const ARRAY3D *d) {
  CALLED;
  MAKE_ARRAY(array_size(d->Width, d->Height, d->Depth, d->NumChannels))
}
CUresult cuArray3DCreate(void **a, const ARRAY3D_V1 *d) {
  CALLED;
  MAKE_ARRAY(array_size(d->Width, d->Height, d->Depth, d->NumChannels))
}
CUresult cuArrayDestroy(void *a) { CALLED; return give((uintptr_t)a); }
CUresult cuMipmappedArrayCreate(void **a, const ARRAY3D *d, unsigned levels) {
  CALLED;
  (void)levels;
  MAKE_ARRAY(array_size(d->Width, d->Height, d->Depth, d->NumChannels))
}
CUresult cuMipmappedArrayDestroy(void *a) { CALLED; return give((uintptr_t)a); }

/* ---- stream-ordered allocations ---- */
CUresult stream_allocation(CUdeviceptr *p, size_t bytes, void *pool_handle, void *stream) {
  int device = current_device() >= 0 ? current_device() : 0;
  if (capture_allocation(stream, p, bytes, device)) return OK;
  pthread_mutex_lock(&fake_mu);
  struct pool *pool = pool_handle ? map_get(&pools, (uintptr_t)pool_handle) : NULL;
  uint64_t ignored;
  if (!pool_handle) pool = current_pools[device] ? current_pools[device] : default_pool(device, &ignored);
  pthread_mutex_unlock(&fake_mu);
  if (!pool) return INVALID;
  return take(p, bytes, pool->host ? HOST : POOLED, pool, 0);
}
CUresult stream_free(CUdeviceptr p, void *stream) {
  if (capture_free(stream, p)) return OK;
  if (is_graph_memory(p)) return graph_memory_freed(p), OK;
  return give(p);
}
CUresult cuMemAllocAsync(CUdeviceptr *p, size_t n, void *s) { CALLED; return stream_allocation(p, n, NULL, s); }
CUresult cuMemAllocAsync_ptsz(CUdeviceptr *p, size_t n, void *s) { CALLED; return stream_allocation(p, n, NULL, s); }
CUresult cuMemAllocFromPoolAsync(CUdeviceptr *p, size_t n, void *pool, void *s) {
  CALLED;
  return pool ? stream_allocation(p, n, pool, s) : INVALID;
}
CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *p, size_t n, void *pool, void *s) {
  CALLED;
  return pool ? stream_allocation(p, n, pool, s) : INVALID;
}
CUresult cuMemFreeAsync(CUdeviceptr p, void *s) { CALLED; return stream_free(p, s); }
CUresult cuMemFreeAsync_ptsz(CUdeviceptr p, void *s) { CALLED; return stream_free(p, s); }

CUresult cuMemPoolCreate(void **pool, const PROP *props) {
  CALLED;
  if (!props) return INVALID;
  int host = props->location.type != 1;
  uint64_t handle;
  pthread_mutex_lock(&fake_mu);
  new_pool(host ? 0 : props->location.id, host, &handle);
  pthread_mutex_unlock(&fake_mu);
  *pool = (void *)(uintptr_t)handle;
  return OK;
}
CUresult cuMemPoolDestroy(void *pool) {
  CALLED;
  pthread_mutex_lock(&fake_mu);
  struct pool *p = map_get(&pools, (uintptr_t)pool);
  if (p) p->destroyed = 1, p->threshold = 0;
  if (p && !p->host) pool_release_to(p, 0);
  pthread_mutex_unlock(&fake_mu);
  return p ? OK : INVALID;
}
CUresult cuMemPoolSetAttribute(void *pool, int attr, void *value) {
  CALLED;
  pthread_mutex_lock(&fake_mu);
  struct pool *p = map_get(&pools, (uintptr_t)pool);
  if (p && attr == 4) p->threshold = *(uint64_t *)value;
  pthread_mutex_unlock(&fake_mu);
  return p ? OK : INVALID;
}
CUresult cuMemPoolGetAttribute(void *pool, int attr, void *value) {
  CALLED;
  pthread_mutex_lock(&fake_mu);
  struct pool *p = map_get(&pools, (uintptr_t)pool);
  if (p) {
    uint64_t v = attr == 4 ? p->threshold : attr == 5 || attr == 6 ? p->reserved
               : attr == 7 || attr == 8 ? p->used : 0;
    *(uint64_t *)value = v;
  }
  pthread_mutex_unlock(&fake_mu);
  return p ? OK : INVALID;
}
CUresult cuMemPoolTrimTo(void *pool, size_t keep) {
  CALLED;
  pthread_mutex_lock(&fake_mu);
  struct pool *p = map_get(&pools, (uintptr_t)pool);
  if (p && !p->host && p->reserved > p->used + keep) pool_release_to(p, keep > p->used ? keep - p->used : 0);
  pthread_mutex_unlock(&fake_mu);
  return p ? OK : INVALID;
}
CUresult cuDeviceGetDefaultMemPool(void **pool, int device) {
  CALLED;
  uint64_t handle;
  pthread_mutex_lock(&fake_mu);
  default_pool(device, &handle);
  pthread_mutex_unlock(&fake_mu);
  *pool = (void *)(uintptr_t)handle;
  return OK;
}
CUresult cuDeviceGetMemPool(void **pool, int device) {
  CALLED;
  pthread_mutex_lock(&fake_mu);
  uint64_t handle = 0;
  struct pool *p = current_pools[device];
  if (!p) {
    default_pool(device, &handle);
  } else {
    for (int b = 0; b < 4096 && !handle; b++)
      for (struct entry *e = pools.bucket[b]; e && !handle; e = e->next)
        if (e->value == p) handle = e->key;
  }
  pthread_mutex_unlock(&fake_mu);
  *pool = (void *)(uintptr_t)handle;
  return OK;
}
CUresult cuDeviceSetMemPool(int device, void *pool) {
  CALLED;
  pthread_mutex_lock(&fake_mu);
  current_pools[device] = map_get(&pools, (uintptr_t)pool);
  pthread_mutex_unlock(&fake_mu);
  return OK;
}

/* ---- virtual memory management: memory freed at the last unmap and release ---- */
struct vmm {
  int device, host, exported, imported;
  uint64_t size;
  int refs, maps;
};
struct mapping {
  uint64_t handle, size;
};
static struct map handles, mappings;
static uint64_t next_va = 0x600000000000ULL;

static void let_go_locked(uint64_t handle, struct vmm *v) {
  if (v->refs > 0 || v->maps > 0) return;
  map_take(&handles, handle);
  handle_give(handle);
  /* An exported allocation may live in another process: kept until this one exits. */
  int give_back = !v->host && !v->imported && !v->exported;
  int device = v->device;
  uint64_t size = v->size;
  free(v);
  if (give_back) {
    pthread_mutex_unlock(&fake_mu);
    fake_device_give(device, size);
    pthread_mutex_lock(&fake_mu);
  }
}

CUresult cuMemCreate(unsigned long long *h, size_t n, const PROP *prop, unsigned long long f) {
  CALLED;
  (void)f;
  if (!prop) return INVALID;
  int host = prop->location.type != 1;
  if (!host && !fake_device_take(prop->location.id, n)) return OOM;
  struct vmm *v = calloc(1, sizeof *v);
  *v = (struct vmm){.device = host ? 0 : prop->location.id, .host = host, .size = n, .refs = 1};
  pthread_mutex_lock(&fake_mu);
  *h = handle_take();
  map_put(&handles, *h, v);
  pthread_mutex_unlock(&fake_mu);
  return OK;
}
CUresult cuMemRelease(unsigned long long h) {
  CALLED;
  pthread_mutex_lock(&fake_mu);
  struct vmm *v = map_get(&handles, h);
  if (v && v->refs > 0) {
    v->refs--;
    let_go_locked(h, v);
  }
  pthread_mutex_unlock(&fake_mu);
  return v ? OK : INVALID;
}
CUresult cuMemAddressReserve(CUdeviceptr *p, size_t size, size_t align, CUdeviceptr addr,
                             unsigned long long flags) {
  CALLED;
  (void)align, (void)addr, (void)flags;
  pthread_mutex_lock(&fake_mu);
  *p = next_va;
  next_va += (size + (2 << 20) - 1) / (2 << 20) * (2 << 20);
  pthread_mutex_unlock(&fake_mu);
  return OK;
}
CUresult cuMemAddressFree(CUdeviceptr p, size_t size) { CALLED; (void)p, (void)size; return OK; }
CUresult cuMemMap(CUdeviceptr va, size_t size, size_t offset, unsigned long long h,
                  unsigned long long flags) {
  CALLED;
  (void)offset, (void)flags;
  pthread_mutex_lock(&fake_mu);
  struct vmm *v = map_get(&handles, h);
  int ok = v && !map_get(&mappings, va);
  if (ok) {
    struct mapping *m = malloc(sizeof *m);
    *m = (struct mapping){h, size};
    map_put(&mappings, va, m);
    v->maps++;
  }
  pthread_mutex_unlock(&fake_mu);
  return ok ? OK : INVALID;
}
CUresult cuMemUnmap(CUdeviceptr va, size_t size) {
  CALLED;
  pthread_mutex_lock(&fake_mu);
  uint64_t at = va, end = va + size;
  int whole = 1; /* the range must cover whole mappings */
  while (at < end && whole) {
    struct mapping *m = map_get(&mappings, at);
    whole = m != NULL;
    if (m) at += m->size;
  }
  for (at = va; whole && at < end;) {
    struct mapping *m = map_take(&mappings, at);
    struct vmm *v = map_get(&handles, m->handle);
    at += m->size;
    if (v) {
      v->maps--;
      let_go_locked(m->handle, v);
    }
    free(m);
  }
  pthread_mutex_unlock(&fake_mu);
  return whole ? OK : INVALID;
}
CUresult cuMemRetainAllocationHandle(unsigned long long *h, void *address) {
  CALLED;
  pthread_mutex_lock(&fake_mu);
  struct mapping *m = map_get(&mappings, (uintptr_t)address);
  struct vmm *v = m ? map_get(&handles, m->handle) : NULL;
  if (v) v->refs++, *h = m->handle;
  pthread_mutex_unlock(&fake_mu);
  return v ? OK : INVALID;
}
CUresult cuMemExportToShareableHandle(void *out, unsigned long long h, int type,
                                      unsigned long long flags) {
  CALLED;
  (void)flags;
  pthread_mutex_lock(&fake_mu);
  struct vmm *v = map_get(&handles, h);
  if (v) v->exported = 1;
  uint64_t size = v ? v->size : 0;
  pthread_mutex_unlock(&fake_mu);
  if (!v || type != 1) return INVALID; /* POSIX file descriptors only */
  int fd = memfd_create("fake-cuda-allocation", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, (off_t)size) != 0) return INVALID;
  *(int *)out = fd;
  return OK;
}
CUresult cuMemImportFromShareableHandle(unsigned long long *h, void *shareable, int type) {
  CALLED;
  struct stat info;
  if (type != 1 || fstat((int)(intptr_t)shareable, &info) != 0) return INVALID;
  struct vmm *v = calloc(1, sizeof *v);
  *v = (struct vmm){.size = (uint64_t)info.st_size, .imported = 1, .refs = 1};
  pthread_mutex_lock(&fake_mu);
  *h = handle_take();
  map_put(&handles, *h, v);
  pthread_mutex_unlock(&fake_mu);
  return OK;
}
CUresult cuMemGetAllocationPropertiesFromHandle(PROP *prop, unsigned long long h) {
  CALLED;
  pthread_mutex_lock(&fake_mu);
  struct vmm *v = map_get(&handles, h);
  if (v) *prop = (PROP){.type = 1, .location = {v->host ? 2 : 1, v->device}};
  pthread_mutex_unlock(&fake_mu);
  return v ? OK : INVALID;
}
