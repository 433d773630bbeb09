/*
 * Linear allocations: cuMemAlloc (both ABIs), cuMemAllocPitch, cuMemAllocManaged, the
 * stream-ordered cuMemAllocAsync and cuMemAllocFromPoolAsync, the arrays, and their frees.
 *
 * An allocation is charged before the driver is asked (refused in advance: the size is
 * known), recorded by its address once the driver answers, and given back when its free
 * succeeds. The order closes two races with addresses the driver reuses at once:
 *
 *   - a free takes the address's entry out *before* the driver frees it (and puts it
 *     back if the free fails), so an allocation on another thread that gets the same
 *     address back records it afresh and is never mistaken for the freed one;
 *   - an entry already there for an address the driver just handed out is stale (its
 *     memory went without a free we saw: a destroyed context): it is given back and
 *     replaced, never silently overwritten.
 *
 * Not charged: managed memory attached to the host (CU_MEM_ATTACH_HOST), allocations from
 * a pool located on the host, and allocations a stream capture records (graphs.c charges
 * graph memory when the driver reserves it; they are checked against the budget first).
 */
#include "shim.h"

static struct table pointers;

#define BYTES_BITS 44
uint64_t pack(uint64_t bytes, int index, int kind, int pool) {
  return (bytes & ((1ULL << BYTES_BITS) - 1)) | (uint64_t)(index & 15) << 44 |
         (uint64_t)(kind & 15) << 48 | (uint64_t)(pool & 0xfff) << 52;
}
uint64_t packed_bytes(uint64_t a) { return a & ((1ULL << BYTES_BITS) - 1); }
int packed_index(uint64_t a) { return (int)(a >> 44 & 15); }
int packed_kind(uint64_t a) { return (int)(a >> 48 & 15); }
int packed_pool(uint64_t a) { return (int)(a >> 52 & 0xfff) - 1; }

void memory_reset(void) { table_release(&pointers); }

static void give_back(uint64_t a) {
  if (packed_kind(a) != KIND_CHARGED) return;
  int pool = packed_pool(a);
  uint64_t bytes = packed_bytes(a);
  uncharge(packed_index(a), pool >= 0 ? pool_freed(pool, bytes) : bytes);
}

/* Room to record the allocation, then its charge; 0: refused (nothing held). */
static int reserve(void) {
  pthread_mutex_lock(&shim.mu);
  int ok = table_reserve(&pointers);
  pthread_mutex_unlock(&shim.mu);
  if (!ok) say("no memory left for the shim's own records: allocation refused");
  return ok;
}

static void unreserve(void) {
  pthread_mutex_lock(&shim.mu);
  table_unreserve();
  pthread_mutex_unlock(&shim.mu);
}

static void record(uint64_t key, uint64_t a) {
  uint64_t old = 0;
  pthread_mutex_lock(&shim.mu);
  int stale = table_put(&pointers, key, a, 0, &old, NULL);
  pthread_mutex_unlock(&shim.mu);
  if (stale) give_back(old);
}

static int charged_before(int index, uint64_t bytes, const char *call) {
  if (!reserve()) return 0;
  if (charge(index, bytes, call, 0)) return 1;
  unreserve();
  return 0;
}

static CUresult charged_after(CUresult rc, uint64_t key, int index, uint64_t bytes) {
  if (rc == CUDA_SUCCESS) {
    record(key, pack(bytes, index, KIND_CHARGED, 0));
  } else {
    uncharge(index, bytes);
    unreserve();
  }
  return rc;
}

/* A device allocation of a size known before the call. */
#define ALLOCATE(name, key_out, bytes, call_args, ...)                  \
  typedef CUresult (*fn_t)(__VA_ARGS__);                                 \
  fn_t fn = REAL(name, fn_t);                                            \
  if (!fn) return CUDA_ERROR_NOT_FOUND;                                  \
  if (!active()) return fn call_args;                                    \
  int index = current_index();                                           \
  uint64_t need = (bytes);                                               \
  if (!charged_before(index, need, #name)) return CUDA_ERROR_OUT_OF_MEMORY; \
  CUresult rc = fn call_args;                                            \
  return charged_after(rc, rc == CUDA_SUCCESS ? (uint64_t)(key_out) : 0, index, need);

/* A free: the entry leaves first, and comes back if the driver says no. */
static CUresult release(void *fn_any, int kind_of_call, uint64_t key, CUstream stream) {
  int on = active();
  uint64_t a = 0, b = 0;
  int found = 0;
  if (on) {
    pthread_mutex_lock(&shim.mu);
    found = table_take(&pointers, key, &a, &b);
    pthread_mutex_unlock(&shim.mu);
  }
  CUresult rc;
  if (kind_of_call == 0) rc = ((CUresult(*)(CUdeviceptr))fn_any)(key);
  else if (kind_of_call == 1) rc = ((CUresult(*)(CUdeviceptr_v1))fn_any)((CUdeviceptr_v1)key);
  else rc = ((CUresult(*)(CUdeviceptr, CUstream))fn_any)(key, stream);
  if (!found) return rc;
  if (rc == CUDA_SUCCESS) {
    give_back(a);
  } else {
    pthread_mutex_lock(&shim.mu);
    table_put(&pointers, key, a, b, NULL, NULL);
    pthread_mutex_unlock(&shim.mu);
  }
  return rc;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) {
  ALLOCATE(cuMemAlloc_v2, *dptr, bytes, (dptr, bytes), CUdeviceptr *, size_t)
}
EXPORT CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytes) {
  ALLOCATE(cuMemAlloc, *dptr, bytes, (dptr, bytes), CUdeviceptr_v1 *, unsigned int)
}

EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned flags) {
  typedef CUresult (*fn_t)(CUdeviceptr *, size_t, unsigned);
  fn_t fn = REAL(cuMemAllocManaged, fn_t);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  if (flags & CU_MEM_ATTACH_HOST || !active()) return fn(dptr, bytes, flags); /* host memory */
  int index = current_index();
  if (!charged_before(index, bytes, "cuMemAllocManaged")) return CUDA_ERROR_OUT_OF_MEMORY;
  CUresult rc = fn(dptr, bytes, flags);
  return charged_after(rc, rc == CUDA_SUCCESS ? *dptr : 0, index, bytes);
}

/* A pitched allocation's size is the driver's pitch times the height: charge the width
 * first, then settle on what the driver chose. */
#define PITCHED(name, ptr_t, size_t_)                                           \
  typedef CUresult (*fn_t)(ptr_t *, size_t_ *, size_t_, size_t_, unsigned);       \
  fn_t fn = REAL(name, fn_t);                                                   \
  if (!fn) return CUDA_ERROR_NOT_FOUND;                                         \
  if (!active()) return fn(dptr, pitch, width, height, element);                \
  int index = current_index();                                                  \
  uint64_t need = (uint64_t)width * height;                                     \
  if (!charged_before(index, need, #name)) return CUDA_ERROR_OUT_OF_MEMORY;      \
  CUresult rc = fn(dptr, pitch, width, height, element);                        \
  if (rc != CUDA_SUCCESS) return charged_after(rc, 0, index, need);             \
  uint64_t took = (uint64_t)*pitch * height;                                    \
  if (took > need) charge(index, took - need, #name, 1);                        \
  return charged_after(rc, *dptr, index, took > need ? took : need);

EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width,
                                   size_t height, unsigned element) {
  PITCHED(cuMemAllocPitch_v2, CUdeviceptr, size_t)
}
EXPORT CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned *pitch, unsigned width,
                                unsigned height, unsigned element) {
  PITCHED(cuMemAllocPitch, CUdeviceptr_v1, unsigned)
}

/* Stream-ordered allocations: from the stream's device's current pool, or a given one. */
static CUresult stream_ordered(int which, int from_pool, CUdeviceptr *dptr, size_t bytes,
                               CUmemoryPool pool, CUstream stream) {
  void *fn = real(which);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
#define CALL()                                                                                 \
  (from_pool ? ((CUresult(*)(CUdeviceptr *, size_t, CUmemoryPool, CUstream))fn)(dptr, bytes, \
                                                                                pool, stream) \
             : ((CUresult(*)(CUdeviceptr *, size_t, CUstream))fn)(dptr, bytes, stream))
  if (!active()) return CALL();
  const char *call = from_pool ? "cuMemAllocFromPoolAsync" : "cuMemAllocAsync";
  int p = from_pool ? pool_index(pool, 1) : -1;
  int index = current_index();
  if (capturing(stream)) { /* the graph's memory: charged when the driver reserves it */
    if (p >= 0 && pool_is_host(p)) return CALL();
    if (!fits(index, bytes, call) || !reserve()) return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = CALL();
    if (rc == CUDA_SUCCESS) record(*dptr, pack(bytes, index, KIND_GRAPH, 0));
    else unreserve();
    return rc;
  }
  if (!from_pool && pools_keep()) p = pool_index(current_pool(), 1);
  if (p >= 0 && pool_is_host(p)) return CALL(); /* host memory */
  if (pool_device(p) >= 0) index = pool_device(p);
  int64_t charged = 0;
  if (!reserve()) return CUDA_ERROR_OUT_OF_MEMORY;
  if (!pool_before(p, index, bytes, call, &charged)) {
    unreserve();
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  CUresult rc = CALL();
  pool_after(p, index, bytes, charged, rc == CUDA_SUCCESS);
  if (rc == CUDA_SUCCESS) record(*dptr, pack(bytes, index, KIND_CHARGED, p + 1));
  else unreserve();
  return rc;
#undef CALL
}

EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream stream) {
  return stream_ordered(W_cuMemAllocAsync, 0, dptr, bytes, NULL, stream);
}
EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream stream) {
  return stream_ordered(W_cuMemAllocAsync_ptsz, 0, dptr, bytes, NULL, stream);
}
EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                                        CUstream stream) {
  return stream_ordered(W_cuMemAllocFromPoolAsync, 1, dptr, bytes, pool, stream);
}
EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                                             CUstream stream) {
  return stream_ordered(W_cuMemAllocFromPoolAsync_ptsz, 1, dptr, bytes, pool, stream);
}

#define FREE(name, kind, key, stream)                \
  void *fn = real(W_##name);                         \
  if (!fn) return CUDA_ERROR_NOT_FOUND;              \
  return release(fn, kind, (uint64_t)(key), stream);

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) { FREE(cuMemFree_v2, 0, dptr, NULL) }
EXPORT CUresult cuMemFree(CUdeviceptr_v1 dptr) { FREE(cuMemFree, 1, dptr, NULL) }
EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
  FREE(cuMemFreeAsync, 2, dptr, stream)
}
EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
  FREE(cuMemFreeAsync_ptsz, 2, dptr, stream)
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
#define ARRAY2D(desc) \
  ((desc) ? array_bytes((desc)->Width, (desc)->Height, 1, (desc)->Format, (desc)->NumChannels) : 0)
#define ARRAY3D(desc)                                                                    \
  ((desc) ? array_bytes((desc)->Width, (desc)->Height, (desc)->Depth, (desc)->Format, \
                        (desc)->NumChannels)                                             \
          : 0)

EXPORT CUresult cuArrayCreate_v2(CUarray *array, const CUDA_ARRAY_DESCRIPTOR *desc) {
  ALLOCATE(cuArrayCreate_v2, (uintptr_t)*array, ARRAY2D(desc), (array, desc), CUarray *,
           const CUDA_ARRAY_DESCRIPTOR *)
}
EXPORT CUresult cuArrayCreate(CUarray *array, const CUDA_ARRAY_DESCRIPTOR_v1 *desc) {
  ALLOCATE(cuArrayCreate, (uintptr_t)*array, ARRAY2D(desc), (array, desc), CUarray *,
           const CUDA_ARRAY_DESCRIPTOR_v1 *)
}
EXPORT CUresult cuArray3DCreate_v2(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
  ALLOCATE(cuArray3DCreate_v2, (uintptr_t)*array, ARRAY3D(desc), (array, desc), CUarray *,
           const CUDA_ARRAY3D_DESCRIPTOR *)
}
EXPORT CUresult cuArray3DCreate(CUarray *array, const CUDA_ARRAY3D_DESCRIPTOR_v1 *desc) {
  ALLOCATE(cuArray3DCreate, (uintptr_t)*array, ARRAY3D(desc), (array, desc), CUarray *,
           const CUDA_ARRAY3D_DESCRIPTOR_v1 *)
}
EXPORT CUresult cuArrayDestroy(CUarray array) { FREE(cuArrayDestroy, 0, (uintptr_t)array, NULL) }
/* A mipmapped array's levels add up to at most 4/3 of its base level. */
EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *array, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                       unsigned levels) {
  ALLOCATE(cuMipmappedArrayCreate, (uintptr_t)*array, ARRAY3D(desc) / 3 * 4,
           (array, desc, levels), CUmipmappedArray *, const CUDA_ARRAY3D_DESCRIPTOR *, unsigned)
}
EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray array) {
  FREE(cuMipmappedArrayDestroy, 0, (uintptr_t)array, NULL)
}
