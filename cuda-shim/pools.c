/*
 * Stream-ordered pools (cuMemAllocAsync, cuMemAllocFromPoolAsync): a pool is charged what
 * it holds on the device, not only what its live allocations hold.
 *
 * A pool keeps the memory of freed allocations for reuse. With the default release
 * threshold (0) it gives it back at the next synchronization, so its allocations are
 * charged as they are made and freed. With a threshold above zero (PyTorch's
 * backend:cudaMallocAsync sets the largest, RAPIDS' async resource its own) it keeps up
 * to that much reserved: the shim charges a pool `kept` = min(reserved - used, threshold)
 * on top of its live allocations, read from the driver (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT
 * and _USED_MEM_CURRENT) after each allocation, threshold change and trim. A free into such
 * a pool gives back only what the pool will not keep; an allocation the pool's kept
 * memory can serve costs nothing more, and one it cannot is refused in advance if the
 * pool's growth would not fit.
 *
 * Pools located on the host (CU_MEM_LOCATION_TYPE_HOST, _HOST_NUMA) hold no device memory
 * and are never charged. Under shim.mu; at most MAX_POOLS live pools are tracked (more
 * are charged as threshold-0 pools: their allocations as made).
 */
#include "shim.h"

#define MAX_POOLS 256

static struct pool {
  CUmemoryPool handle;
  int index;           /* the budget's device */
  int host, destroyed; /* destroyed: kept until its last allocation is freed */
  uint64_t threshold, kept, outstanding;
} pools[MAX_POOLS];
static int used_pools, keepers;

typedef CUresult (*attr_fn)(CUmemoryPool, int, void *);

static uint64_t attribute(CUmemoryPool pool, int attr) {
  attr_fn get = DRIVER(attr_fn, "cuMemPoolGetAttribute");
  uint64_t value = 0;
  if (!get || get(pool, attr, &value) != CUDA_SUCCESS) return 0;
  return value;
}

static int find_locked(CUmemoryPool handle) {
  for (int i = 0; i < used_pools; i++)
    if (pools[i].handle == handle && !pools[i].destroyed) return i;
  return -1;
}

static int add_locked(CUmemoryPool handle, int index, int host, uint64_t threshold) {
  int slot = -1;
  for (int i = 0; i < used_pools && slot < 0; i++)
    if (!pools[i].handle) slot = i;
  if (slot < 0 && used_pools < MAX_POOLS) slot = used_pools++;
  if (slot < 0) return -1;
  pools[slot] = (struct pool){.handle = handle, .index = index, .host = host,
                              .threshold = threshold};
  if (threshold) keepers++;
  return slot;
}

int pool_index(CUmemoryPool pool, int create) {
  if (!pool) return -1;
  pthread_mutex_lock(&shim.mu);
  int p = find_locked(pool);
  pthread_mutex_unlock(&shim.mu);
  if (p >= 0 || !create) return p;
  /* A pool first seen at an allocation (a device's default pool): its device is the
   * caller's, its threshold what the driver says. */
  int index = current_index();
  uint64_t threshold = attribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD);
  pthread_mutex_lock(&shim.mu);
  p = find_locked(pool);
  if (p < 0) p = add_locked(pool, index, 0, threshold);
  pthread_mutex_unlock(&shim.mu);
  return p;
}

int pool_is_host(int p) { return p >= 0 && pools[p].host; }
int pool_device(int p) { return p >= 0 ? pools[p].index : -1; }
int pool_keeps(int p) { return p >= 0 && __atomic_load_n(&pools[p].threshold, __ATOMIC_RELAXED); }
int pools_keep(void) { return __atomic_load_n(&keepers, __ATOMIC_RELAXED) > 0; }

CUmemoryPool current_pool(void) {
  typedef CUresult (*get_fn)(CUmemoryPool *, CUdevice);
  get_fn get = DRIVER(get_fn, "cuDeviceGetMemPool");
  CUmemoryPool pool = NULL;
  if (!get || get(&pool, current_ordinal()) != CUDA_SUCCESS) return NULL;
  return pool;
}

/* What the pool keeps now: its unused reserved memory, up to its threshold. */
static uint64_t kept_now(int p) {
  uint64_t reserved = attribute(pools[p].handle, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
  uint64_t used = attribute(pools[p].handle, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
  uint64_t spare = reserved > used ? reserved - used : 0;
  uint64_t threshold = __atomic_load_n(&pools[p].threshold, __ATOMIC_RELAXED);
  return spare < threshold ? spare : threshold;
}

/* Sets what the pool keeps to the driver's figure and charges the difference (`extra`:
 * what else the caller has to settle, already net of what it charged). */
static void settle(int p, int64_t extra) {
  uint64_t kept = kept_now(p);
  pthread_mutex_lock(&shim.mu);
  uint64_t before = pools[p].kept;
  pools[p].kept = kept;
  int index = pools[p].index;
  pthread_mutex_unlock(&shim.mu);
  int64_t change = extra + (int64_t)kept - (int64_t)before;
  if (change > 0) charge(index, (uint64_t)change, "a memory pool", 1);
  else uncharge(index, (uint64_t)-change);
}

int pool_before(int p, int index, uint64_t bytes, const char *call, int64_t *charged) {
  if (!pool_keeps(p)) {
    *charged = (int64_t)bytes;
    return charge(index, bytes, call, 0);
  }
  uint64_t reserved = attribute(pools[p].handle, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
  uint64_t used = attribute(pools[p].handle, CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
  uint64_t spare = reserved > used ? reserved - used : 0;
  uint64_t threshold = pools[p].threshold;
  uint64_t left = spare > bytes ? spare - bytes : 0;
  uint64_t kept_after = left < threshold ? left : threshold;
  pthread_mutex_lock(&shim.mu);
  uint64_t kept = pools[p].kept;
  pthread_mutex_unlock(&shim.mu);
  int64_t growth = (int64_t)bytes + (int64_t)kept_after - (int64_t)kept;
  *charged = growth > 0 ? growth : 0;
  return growth <= 0 || charge(index, (uint64_t)growth, call, 0);
}

void pool_after(int p, int index, uint64_t bytes, int64_t charged, int ok) {
  if (!ok) {
    uncharge(index, (uint64_t)charged);
    return;
  }
  if (p >= 0) {
    pthread_mutex_lock(&shim.mu);
    pools[p].outstanding++;
    pthread_mutex_unlock(&shim.mu);
  }
  if (pool_keeps(p)) settle(p, (int64_t)bytes - charged);
}

uint64_t pool_freed(int p, uint64_t bytes) {
  pthread_mutex_lock(&shim.mu);
  struct pool *pool = &pools[p];
  uint64_t kept = pool->kept, room = pool->threshold > kept ? pool->threshold - kept : 0;
  uint64_t keeps = pool->destroyed ? 0 : (bytes < room ? bytes : room);
  pool->kept += keeps;
  if (pool->outstanding) pool->outstanding--;
  if (pool->destroyed && !pool->outstanding) pool->handle = NULL; /* the record is free */
  pthread_mutex_unlock(&shim.mu);
  return bytes - keeps;
}

void pools_reset(void) {
  used_pools = 0, keepers = 0;
}

/* ---- the pool calls ---- */
EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
  typedef CUresult (*fn_t)(CUmemoryPool *, const CUmemPoolProps *);
  fn_t fn = REAL(cuMemPoolCreate, fn_t);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  CUresult rc = fn(pool, props);
  if (rc != CUDA_SUCCESS || !props || !pool || !active()) return rc;
  int device = props->location.type == CU_MEM_LOCATION_TYPE_DEVICE;
  int index = device ? device_index(props->location.id) : -1;
  pthread_mutex_lock(&shim.mu);
  add_locked(*pool, index, !device, 0);
  pthread_mutex_unlock(&shim.mu);
  return rc;
}

EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool) {
  typedef CUresult (*fn_t)(CUmemoryPool);
  fn_t fn = REAL(cuMemPoolDestroy, fn_t);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  CUresult rc = fn(pool);
  if (rc != CUDA_SUCCESS || !active()) return rc;
  pthread_mutex_lock(&shim.mu);
  int p = find_locked(pool);
  uint64_t kept = 0;
  int index = -1;
  if (p >= 0) {
    kept = pools[p].kept, index = pools[p].index;
    if (pools[p].threshold) keepers--;
    pools[p].kept = 0, pools[p].threshold = 0, pools[p].destroyed = 1;
    if (!pools[p].outstanding) pools[p].handle = NULL;
  }
  pthread_mutex_unlock(&shim.mu);
  uncharge(index, kept);
  return rc;
}

EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value) {
  attr_fn fn = REAL(cuMemPoolSetAttribute, attr_fn);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  CUresult rc = fn(pool, attr, value);
  if (rc != CUDA_SUCCESS || attr != CU_MEMPOOL_ATTR_RELEASE_THRESHOLD || !value || !active())
    return rc;
  int p = pool_index(pool, 1);
  if (p < 0) return rc;
  uint64_t threshold = *(const uint64_t *)value;
  pthread_mutex_lock(&shim.mu);
  keepers += (threshold > 0) - (pools[p].threshold > 0);
  __atomic_store_n(&pools[p].threshold, threshold, __ATOMIC_RELAXED);
  pthread_mutex_unlock(&shim.mu);
  settle(p, 0);
  return rc;
}

EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) {
  typedef CUresult (*fn_t)(CUmemoryPool, size_t);
  fn_t fn = REAL(cuMemPoolTrimTo, fn_t);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  CUresult rc = fn(pool, keep);
  if (rc != CUDA_SUCCESS || !active()) return rc;
  int p = pool_index(pool, 0);
  if (pool_keeps(p)) settle(p, 0);
  return rc;
}
