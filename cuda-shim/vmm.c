/*
 * Virtual memory management (cuMemCreate and friends): the physical allocation is what
 * holds device memory, and the driver frees it only when its last reference goes.
 *
 * A handle's references are the creation's, one per cuMemRetainAllocationHandle and one
 * per import, each ended by a cuMemRelease; each cuMemMap holds the memory too, until its
 * cuMemUnmap. Releasing right after mapping is NVIDIA's own sample pattern, so the shim
 * keeps per handle {bytes, references, mappings} and gives the charge back when both
 * counts reach zero, never at a release of a mapped handle.
 *
 * Shared across processes: a handle exported (cuMemExportToShareableHandle) may be held
 * by another process after this one lets go, so its charge stays until this process
 * exits. A handle imported from another process is charged to the importer as it maps
 * it (the mapped extent, refused in advance when it would not fit), and given back at
 * its last unmap and release; within one pod an allocation two processes share counts
 * in both while both hold it.
 *
 * As in memory.c, bookkeeping changes before the driver call and is undone if the call
 * fails, so a handle or address the driver reuses at once is never confused with the one
 * just given back. Memory located on the host (CU_MEM_LOCATION_TYPE_HOST, _HOST_NUMA) is
 * not charged and not followed.
 */
#include "shim.h"

#define EXPORTED 1
#define IMPORTED 2
#define MAX_UNMAPPED 256

static struct table handles;  /* handle -> pack(bytes, device, flags), refs | maps << 32 */
static struct table mappings; /* address -> handle, size */

void vmm_reset(void) {
  table_release(&handles);
  table_release(&mappings);
}

static uint64_t counts(uint64_t refs, uint64_t maps) { return refs | maps << 32; }
static uint64_t refs_of(uint64_t b) { return b & 0xffffffffu; }
static uint64_t maps_of(uint64_t b) { return b >> 32; }

static void let_go(uint64_t a) { /* the handle's memory is gone */
  if (!(packed_kind(a) & EXPORTED)) uncharge(packed_index(a), packed_bytes(a));
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t bytes,
                            const CUmemAllocationProp *prop, unsigned long long flags) {
  typedef CUresult (*fn_t)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                           unsigned long long);
  fn_t fn = REAL(cuMemCreate, fn_t);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  if (!active() || !prop || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return fn(handle, bytes, prop, flags);
  int index = device_index(prop->location.id);
  pthread_mutex_lock(&shim.mu);
  int room = table_reserve(&handles);
  pthread_mutex_unlock(&shim.mu);
  if (!room || !charge(index, bytes, "cuMemCreate", 0)) {
    if (room) table_unreserve();
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  CUresult rc = fn(handle, bytes, prop, flags);
  uint64_t old = 0;
  int stale = 0;
  pthread_mutex_lock(&shim.mu);
  if (rc == CUDA_SUCCESS)
    stale = table_put(&handles, *handle, pack(bytes, index, 0, 0), counts(1, 0), &old, NULL);
  else
    table_unreserve();
  pthread_mutex_unlock(&shim.mu);
  if (rc != CUDA_SUCCESS) uncharge(index, bytes);
  if (stale) let_go(old);
  return rc;
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
  typedef CUresult (*fn_t)(CUmemGenericAllocationHandle);
  fn_t fn = REAL(cuMemRelease, fn_t);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  if (!active()) return fn(handle);
  uint64_t a = 0, b = 0;
  pthread_mutex_lock(&shim.mu);
  int found = table_get(&handles, handle, &a, &b), gone = 0;
  if (found) {
    uint64_t refs = refs_of(b) ? refs_of(b) - 1 : 0;
    gone = !refs && !maps_of(b);
    if (gone) table_take(&handles, handle, NULL, NULL);
    else table_put(&handles, handle, a, counts(refs, maps_of(b)), NULL, NULL);
  }
  pthread_mutex_unlock(&shim.mu);
  CUresult rc = fn(handle);
  if (!found) return rc;
  if (rc == CUDA_SUCCESS) {
    if (gone) let_go(a);
    return rc;
  }
  uint64_t now_a, now_b; /* undo: the reference is still there */
  pthread_mutex_lock(&shim.mu);
  if (table_get(&handles, handle, &now_a, &now_b))
    table_put(&handles, handle, now_a, counts(refs_of(now_b) + 1, maps_of(now_b)), NULL, NULL);
  else
    table_put(&handles, handle, a, b, NULL, NULL);
  pthread_mutex_unlock(&shim.mu);
  return rc;
}

EXPORT CUresult cuMemMap(CUdeviceptr address, size_t size, size_t offset,
                         CUmemGenericAllocationHandle handle, unsigned long long flags) {
  typedef CUresult (*fn_t)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                           unsigned long long);
  fn_t fn = REAL(cuMemMap, fn_t);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  if (!active()) return fn(address, size, offset, handle, flags);
  uint64_t a = 0, b = 0;
  pthread_mutex_lock(&shim.mu);
  int found = table_get(&handles, handle, &a, &b);
  int room = found && table_reserve(&mappings);
  pthread_mutex_unlock(&shim.mu);
  if (!found) return fn(address, size, offset, handle, flags); /* host memory, or not ours */
  if (!room) return CUDA_ERROR_OUT_OF_MEMORY;
  /* An imported allocation is charged here, as far as it is mapped. */
  uint64_t extent = (uint64_t)offset + size, grow = 0;
  int grow_index = packed_index(a);
  if (packed_kind(a) & IMPORTED && extent > packed_bytes(a)) {
    grow = extent - packed_bytes(a);
    if (!charge(packed_index(a), grow, "cuMemMap of an imported allocation", 0)) {
      table_unreserve();
      return CUDA_ERROR_OUT_OF_MEMORY;
    }
  }
  CUresult rc = fn(address, size, offset, handle, flags);
  uint64_t stale_handle = 0, stale_size = 0;
  int stale = 0;
  pthread_mutex_lock(&shim.mu);
  if (rc == CUDA_SUCCESS) {
    stale = table_put(&mappings, address, handle, size, &stale_handle, &stale_size);
    if (table_get(&handles, handle, &a, &b)) {
      uint64_t bytes = packed_bytes(a) + grow;
      a = pack(bytes, packed_index(a), packed_kind(a), 0);
      table_put(&handles, handle, a, counts(refs_of(b), maps_of(b) + 1), NULL, NULL);
    }
  } else {
    table_unreserve();
  }
  /* A mapping we saw no unmap of (its context went): its handle holds one fewer. */
  uint64_t gone_a = 0;
  int gone = 0;
  if (stale && table_get(&handles, stale_handle, &a, &b)) {
    uint64_t maps = maps_of(b) ? maps_of(b) - 1 : 0;
    gone = !maps && !refs_of(b);
    if (gone) table_take(&handles, stale_handle, &gone_a, NULL);
    else table_put(&handles, stale_handle, a, counts(refs_of(b), maps), NULL, NULL);
  }
  pthread_mutex_unlock(&shim.mu);
  if (rc != CUDA_SUCCESS && grow) uncharge(grow_index, grow);
  if (gone) let_go(gone_a);
  return rc;
}

EXPORT CUresult cuMemUnmap(CUdeviceptr address, size_t size) {
  typedef CUresult (*fn_t)(CUdeviceptr, size_t);
  fn_t fn = REAL(cuMemUnmap, fn_t);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  if (!active()) return fn(address, size);
  struct {
    uint64_t address, handle, size, a, b;
    int gone;
  } undone[MAX_UNMAPPED];
  int n = 0;
  pthread_mutex_lock(&shim.mu);
  /* The range covers whole mappings, one after another. */
  for (uint64_t at = address, end = address + size; at < end && n < MAX_UNMAPPED;) {
    uint64_t handle, length, a, b;
    if (!table_take(&mappings, at, &handle, &length) || !length) break;
    undone[n] = (__typeof__(undone[0])){.address = at, .handle = handle, .size = length};
    if (table_get(&handles, handle, &a, &b)) {
      undone[n].a = a, undone[n].b = b;
      uint64_t maps = maps_of(b) ? maps_of(b) - 1 : 0;
      undone[n].gone = !maps && !refs_of(b);
      if (undone[n].gone) table_take(&handles, handle, NULL, NULL);
      else table_put(&handles, handle, a, counts(refs_of(b), maps), NULL, NULL);
    }
    n++;
    at += length;
  }
  pthread_mutex_unlock(&shim.mu);
  CUresult rc = fn(address, size);
  if (rc == CUDA_SUCCESS) {
    for (int i = 0; i < n; i++)
      if (undone[i].gone) let_go(undone[i].a);
    return rc;
  }
  pthread_mutex_lock(&shim.mu); /* undo, last first */
  for (int i = n - 1; i >= 0; i--) {
    uint64_t a, b;
    table_put(&mappings, undone[i].address, undone[i].handle, undone[i].size, NULL, NULL);
    if (undone[i].gone)
      table_put(&handles, undone[i].handle, undone[i].a, undone[i].b, NULL, NULL);
    else if (table_get(&handles, undone[i].handle, &a, &b))
      table_put(&handles, undone[i].handle, a, counts(refs_of(b), maps_of(b) + 1), NULL, NULL);
  }
  pthread_mutex_unlock(&shim.mu);
  return rc;
}

EXPORT CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *address) {
  typedef CUresult (*fn_t)(CUmemGenericAllocationHandle *, void *);
  fn_t fn = REAL(cuMemRetainAllocationHandle, fn_t);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  CUresult rc = fn(handle, address);
  if (rc != CUDA_SUCCESS || !handle || !active()) return rc;
  uint64_t a, b;
  pthread_mutex_lock(&shim.mu);
  if (table_get(&handles, *handle, &a, &b))
    table_put(&handles, *handle, a, counts(refs_of(b) + 1, maps_of(b)), NULL, NULL);
  pthread_mutex_unlock(&shim.mu);
  return rc;
}

EXPORT CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle handle,
                                             int type, unsigned long long flags) {
  typedef CUresult (*fn_t)(void *, CUmemGenericAllocationHandle, int, unsigned long long);
  fn_t fn = REAL(cuMemExportToShareableHandle, fn_t);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  CUresult rc = fn(shareable, handle, type, flags);
  if (rc != CUDA_SUCCESS || !active()) return rc;
  uint64_t a, b;
  pthread_mutex_lock(&shim.mu);
  if (table_get(&handles, handle, &a, &b))
    table_put(&handles, handle,
              pack(packed_bytes(a), packed_index(a), packed_kind(a) | EXPORTED, 0), b, NULL,
              NULL);
  pthread_mutex_unlock(&shim.mu);
  return rc;
}

EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                               void *shareable, int type) {
  typedef CUresult (*fn_t)(CUmemGenericAllocationHandle *, void *, int);
  fn_t fn = REAL(cuMemImportFromShareableHandle, fn_t);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  CUresult rc = fn(handle, shareable, type);
  if (rc != CUDA_SUCCESS || !handle || !active()) return rc;
  typedef CUresult (*props_fn)(void *, CUmemGenericAllocationHandle);
  props_fn props = DRIVER(props_fn, "cuMemGetAllocationPropertiesFromHandle");
  union {
    CUmemAllocationProp prop;
    unsigned char bytes[128];
  } got = {.bytes = {0}};
  int device = 1, ordinal = current_ordinal();
  if (props && props(&got, *handle) == CUDA_SUCCESS) {
    device = got.prop.location.type == CU_MEM_LOCATION_TYPE_DEVICE;
    ordinal = got.prop.location.id;
  }
  if (!device) return rc; /* host memory */
  int index = device_index(ordinal);
  uint64_t a, b;
  pthread_mutex_lock(&shim.mu);
  if (table_get(&handles, *handle, &a, &b)) /* our own allocation, imported back */
    table_put(&handles, *handle, a, counts(refs_of(b) + 1, maps_of(b)), NULL, NULL);
  else if (table_reserve(&handles))
    table_put(&handles, *handle, pack(0, index, IMPORTED, 0), counts(1, 0), NULL, NULL);
  pthread_mutex_unlock(&shim.mu);
  return rc;
}
