/*
 * How applications reach the driver, and how the shim reaches it itself.
 *
 * Applications reach the driver three ways and all three lead to the shim's wrappers:
 * linking (our exported names come first in the global scope), dlopen + dlsym (dlsym is
 * wrapped and hands out our functions for the names we wrap) and cuGetProcAddress
 * (wrapped: the driver's answer for a wrapped name is swapped for ours).
 *
 * A cuGetProcAddress answer is matched by address first: the wrapper whose exported name
 * the driver resolves to the very function it handed out, whatever name was asked (in
 * CUDA 12, "cuGraphInstantiate" answers with cuGraphInstantiateWithFlags). Failing that
 * (a driver that answers with internal addresses), by the driver's documented versioning,
 * where every ABI of the name has one signature; names whose ABIs differ (cuCtxCreate,
 * cuGraphInstantiate) are then left alone.
 *
 * dlsym(RTLD_NEXT, name) for a name we wrap is answered as glibc would answer the caller
 * (a tracer or another interposer preloaded before us): the first object loaded after
 * the caller's that defines the name itself. Each object is asked through a real handle
 * (dlopen with RTLD_NOLOAD), never through its link-map entry.
 */
#include "shim.h"
#include <dlfcn.h>
#include <link.h>
#include <string.h>


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

/* glibc resolves RTLD_NEXT from the caller's address, which would now be ours. */
static void *next_after(const void *caller, const char *name) {
  Dl_info info;
  struct link_map *map = NULL;
  if (!dladdr1(caller, &info, (void **)&map, RTLD_DL_LINKMAP) || !map) return NULL;
  for (map = map->l_next; map; map = map->l_next) {
    if (!map->l_name || !*map->l_name) continue; /* the program, the vDSO: never next */
    void *handle = dlopen(map->l_name, RTLD_LAZY | RTLD_NOLOAD);
    if (!handle) continue;
    void *found = real_dlsym(handle, name);
    dlclose(handle);
    struct link_map *owner = NULL;
    if (found && dladdr1(found, &info, (void **)&owner, RTLD_DL_LINKMAP) && owner == map)
      return found; /* defined by that object itself, not one of its dependencies */
  }
  return NULL;
}

/* ---- the driver's libraries, opened once (dlopen counts references) ---- */
static void *library(void **cached, const char *name) {
  void *handle = __atomic_load_n(cached, __ATOMIC_ACQUIRE);
  if (handle) return handle;
  handle = dlopen(name, RTLD_LAZY | RTLD_NOLOAD);
  if (!handle) handle = dlopen(name, RTLD_LAZY);
  if (handle) __atomic_store_n(cached, handle, __ATOMIC_RELEASE);
  return handle;
}
static void *cuda_handle, *nvml_handle;
void *libcuda(void) { return library(&cuda_handle, "libcuda.so.1"); }
void *libnvml(void) { return library(&nvml_handle, "libnvidia-ml.so.1"); }

void *driver_symbol(const char *name) {
  void *lib = strncmp(name, "nvml", 4) == 0 ? libnvml() : libcuda();
  return lib ? real_dlsym(lib, name) : NULL;
}

/* ---- the wrapped entry points: each knows its real function ---- */
static const char *const export_name[W_COUNT] = {
#define ENTRY(name, base, since, ptds) #name,
#include "entries.h"
#undef ENTRY
};
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

static void *real_fn[W_COUNT];

void *real(int which) {
  void *fn = __atomic_load_n(&real_fn[which], __ATOMIC_ACQUIRE);
  if (fn) return fn;
  fn = driver_symbol(export_name[which]);
  if (fn) __atomic_store_n(&real_fn[which], fn, __ATOMIC_RELEASE);
  return fn;
}

/* Whether `fn` is one of this library's functions (a wrapper a lookup already gave). */
static int ours(const void *fn) {
  static void *base;
  Dl_info info;
  void *mine = __atomic_load_n(&base, __ATOMIC_ACQUIRE);
  if (!mine && dladdr((const void *)&ours, &info)) {
    mine = info.dli_fbase;
    __atomic_store_n(&base, mine, __ATOMIC_RELEASE);
  }
  return mine && dladdr(fn, &info) && info.dli_fbase == mine;
}

/* Records the driver's function behind a wrapper (never one of ours: calling it would
 * charge twice). */
static void learn(int which, void *fn) {
  void *expected = NULL;
  if (fn && !ours(fn))
    __atomic_compare_exchange_n(&real_fn[which], &expected, fn, 0, __ATOMIC_ACQ_REL,
                                __ATOMIC_ACQUIRE);
}

UNINSTRUMENTED static int by_export(const char *name) {
  if (!name || (strncmp(name, "cu", 2) != 0 && strncmp(name, "nvml", 4) != 0)) return -1;
  for (int i = 0; i < W_COUNT; i++)
    if (strcmp(export_name[i], name) == 0) return i;
  return -1;
}

static int by_address(void *fn) {
  void *lib = libcuda();
  for (int i = 0; lib && i < W_COUNT; i++)
    if (strncmp(export_name[i], "cu", 2) == 0 && real_dlsym(lib, export_name[i]) == fn) return i;
  return -1;
}

static int by_version(const char *symbol, int version, unsigned long long flags) {
  if (strcmp(symbol, "cuCtxCreate") == 0 || strcmp(symbol, "cuGraphInstantiate") == 0)
    return -1; /* several signatures: by address only */
  int best = -1, best_score = -1;
  int ptds = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  for (int i = 0; i < W_COUNT; i++) {
    if (strcmp(base_name[i], symbol) != 0 || since_version[i] > version) continue;
    if (per_thread[i] && !ptds) continue;
    int score = since_version[i] * 2 + per_thread[i];
    if (score > best_score) best = i, best_score = score;
  }
  return best;
}

static void swap_in(const char *symbol, void **pfn, int version, unsigned long long flags) {
  if (!*pfn || strncmp(symbol, "cu", 2) != 0 || ours(*pfn)) return;
  int known = 0;
  for (int i = 0; i < W_COUNT && !known; i++) known = strcmp(base_name[i], symbol) == 0;
  if (!known) return;
  int which = by_address(*pfn);
  const char *how = "by address";
  if (which < 0) which = by_version(symbol, version, flags), how = "by version";
  const char *debug = shim_getenv("GPUPACK_CUDA_DEBUG"); /* lookups come before a call */
  if (debug && strcmp(debug, "1") == 0)
    say("cuGetProcAddress(%s, %d, %llu): %s%s%s", symbol, version, flags,
        which < 0 ? "left alone" : export_name[which], which < 0 ? "" : " ", which < 0 ? "" : how);
  if (which < 0) return;
  learn(which, *pfn);
  *pfn = wrapper(which);
}

typedef CUresult (*gpa_t)(const char *, void **, int, unsigned long long);
typedef CUresult (*gpa2_t)(const char *, void **, int, unsigned long long,
                           CUdriverProcAddressQueryResult *);

EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int version,
                                 unsigned long long flags) {
  gpa_t fn = REAL(cuGetProcAddress, gpa_t);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  CUresult rc = fn(symbol, pfn, version, flags);
  if (rc == CUDA_SUCCESS && symbol && pfn) swap_in(symbol, pfn, version, flags);
  return rc;
}

EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                                    unsigned long long flags,
                                    CUdriverProcAddressQueryResult *status) {
  gpa2_t fn = REAL(cuGetProcAddress_v2, gpa2_t);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
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
