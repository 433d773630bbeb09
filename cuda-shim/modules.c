/*
 * Modules and libraries: their __device__ globals.
 *
 * A cubin's globals (its .nv.global sections) are read from the image before it is loaded
 * and charged, refused in advance past the budget. Anything else a load takes is
 * measured (measure.c), on a device where this process has a context: an exact reading
 * that takes the pod past its limit unloads the module and refuses the load. An image
 * whose size only the driver knows (PTX, a compressed fatbin) and that the driver loads
 * lazily, at a kernel's first use, is not charged (docs/isolation.md says so).
 */
#include "shim.h"
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

static struct table modules; /* module or library -> pack(bytes, device) */

void modules_reset(void) { table_release(&modules); }

/* The bytes of a cubin's __device__ globals (.nv.global, .nv.global.init), read through
 * `at` (an image in memory, or a file). 0: not a cubin, or unreadable. */
typedef int (*reader)(const void *source, uint64_t offset, void *out, size_t bytes);

static int from_memory(const void *source, uint64_t offset, void *out, size_t bytes) {
  memcpy(out, (const unsigned char *)source + offset, bytes);
  return 1;
}
static int from_file(const void *source, uint64_t offset, void *out, size_t bytes) {
  return pread(*(const int *)source, out, bytes, (off_t)offset) == (ssize_t)bytes;
}

static uint64_t u64_at(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }
static uint32_t u32_at(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint16_t u16_at(const unsigned char *p) { uint16_t v; memcpy(&v, p, 2); return v; }

static uint64_t cubin_globals(reader at, const void *source) {
  unsigned char head[64], section[64], name[16];
  if (!at(source, 0, head, sizeof head) || memcmp(head, "\177ELF\2\1", 6) != 0 ||
      u16_at(head + 18) != 190 /* EM_CUDA */ || u16_at(head + 58) != 64)
    return 0;
  uint64_t table = u64_at(head + 40);
  unsigned count = u16_at(head + 60), names_index = u16_at(head + 62);
  if (!table || count > 4096 || names_index >= count || table > (1ULL << 30)) return 0;
  if (!at(source, table + (uint64_t)names_index * 64, section, sizeof section)) return 0;
  uint64_t names = u64_at(section + 24);
  if (names > (1ULL << 30)) return 0;
  uint64_t bytes = 0;
  for (unsigned i = 0; i < count; i++) {
    if (!at(source, table + (uint64_t)i * 64, section, sizeof section)) return 0;
    uint32_t offset = u32_at(section);
    if (!at(source, names + offset, name, 10)) return 0;
    if (memcmp(name, ".nv.global", 10) == 0) bytes += u64_at(section + 32);
  }
  return bytes;
}

static uint64_t image_globals(const void *image) {
  return image ? cubin_globals(from_memory, image) : 0;
}

static uint64_t file_globals(const char *path) {
  if (!path) return 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  uint64_t bytes = cubin_globals(from_file, &fd);
  close(fd);
  return bytes;
}

struct load {
  const char *call;
  int ordinal, index, measured;
  uint64_t declared;
  nvmlDevice_t device;
  struct reading before, after;
};

/* Before a module is loaded: charge what its image declares; 0: refused. */
static int before_load(struct load *l, const char *call, uint64_t declared) {
  l->call = call, l->declared = declared;
  l->ordinal = current_ordinal(), l->index = device_index(l->ordinal);
  pthread_mutex_lock(&shim.mu);
  int room = table_reserve(&modules);
  pthread_mutex_unlock(&shim.mu);
  if (!room) return 0;
  if (declared && !charge(l->index, declared, call, 0)) {
    table_unreserve();
    return 0;
  }
  l->measured = has_context(l->index);
  l->device = l->measured ? nvml_device(l->ordinal) : NULL;
  if (l->measured) read_nvml(l->device, host_pid(l->index), &l->before);
  return 1;
}

/* After: charge what it took beyond its declared globals, record it; an exact reading
 * past the limit unloads it (`unload`) and refuses. */
static CUresult after_load(struct load *l, CUresult rc, void *handle, CUresult (*unload)(void *)) {
  if (rc != CUDA_SUCCESS) {
    table_unreserve();
    uncharge(l->index, l->declared);
    return rc;
  }
  uint64_t total = l->declared;
  int exact = 0;
  if (l->measured) {
    read_nvml(l->device, host_pid(l->index), &l->after);
    uint64_t measured = took(&l->before, &l->after, &exact);
    if (measured > total) {
      charge(l->index, measured - total, l->call, 1);
      total = measured;
    }
  }
  if (exact && total > l->declared && l->index >= 0 && pod_used(l->index) > shim.limit) {
    unload(handle);
    uncharge(l->index, total);
    table_unreserve();
    fits(l->index, total, l->call); /* says the refusal */
    return CUDA_ERROR_OUT_OF_MEMORY;
  }
  pthread_mutex_lock(&shim.mu);
  table_put(&modules, (uint64_t)(uintptr_t)handle, pack(total, l->index, 0, 0), 0, NULL, NULL);
  pthread_mutex_unlock(&shim.mu);
  return rc;
}

static CUresult unloaded(CUresult (*unload)(void *), void *handle) {
  if (!active()) return unload(handle);
  uint64_t a = 0;
  pthread_mutex_lock(&shim.mu);
  int found = table_take(&modules, (uint64_t)(uintptr_t)handle, &a, NULL);
  pthread_mutex_unlock(&shim.mu);
  CUresult rc = unload(handle);
  if (!found) return rc;
  if (rc == CUDA_SUCCESS) {
    uncharge(packed_index(a), packed_bytes(a));
  } else {
    pthread_mutex_lock(&shim.mu);
    table_put(&modules, (uint64_t)(uintptr_t)handle, a, 0, NULL, NULL);
    pthread_mutex_unlock(&shim.mu);
  }
  return rc;
}

#define LOAD(name, unload_name, declared, handle, call_args, ...)                        \
  typedef CUresult (*fn_t)(__VA_ARGS__);                                                   \
  fn_t fn = REAL(name, fn_t);                                                              \
  CUresult (*unload)(void *) = (CUresult(*)(void *))real(W_##unload_name);                 \
  if (!fn) return CUDA_ERROR_NOT_FOUND;                                                    \
  if (!active() || !unload) return fn call_args;                                           \
  struct load l;                                                                           \
  if (!before_load(&l, #name, (declared))) return CUDA_ERROR_OUT_OF_MEMORY;                \
  CUresult rc = fn call_args;                                                              \
  return after_load(&l, rc, rc == CUDA_SUCCESS ? (void *)*(handle) : NULL, unload);

EXPORT CUresult cuModuleLoad(CUmodule *module, const char *path) {
  LOAD(cuModuleLoad, cuModuleUnload, file_globals(path), module, (module, path), CUmodule *,
       const char *)
}
EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image) {
  LOAD(cuModuleLoadData, cuModuleUnload, image_globals(image), module, (module, image),
       CUmodule *, const void *)
}
EXPORT CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned count,
                                   int *options, void **values) {
  LOAD(cuModuleLoadDataEx, cuModuleUnload, image_globals(image), module,
       (module, image, count, options, values), CUmodule *, const void *, unsigned, int *,
       void **)
}
EXPORT CUresult cuModuleLoadFatBinary(CUmodule *module, const void *image) {
  LOAD(cuModuleLoadFatBinary, cuModuleUnload, image_globals(image), module, (module, image),
       CUmodule *, const void *)
}
EXPORT CUresult cuModuleUnload(CUmodule module) {
  void *fn = real(W_cuModuleUnload);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  return unloaded((CUresult(*)(void *))fn, module);
}
EXPORT CUresult cuLibraryLoadData(CUlibrary *library, const void *code, int *jit_options,
                                  void **jit_values, unsigned jit_count, int *options,
                                  void **values, unsigned count) {
  LOAD(cuLibraryLoadData, cuLibraryUnload, image_globals(code), library,
       (library, code, jit_options, jit_values, jit_count, options, values, count), CUlibrary *,
       const void *, int *, void **, unsigned, int *, void **, unsigned)
}
EXPORT CUresult cuLibraryLoadFromFile(CUlibrary *library, const char *path, int *jit_options,
                                      void **jit_values, unsigned jit_count, int *options,
                                      void **values, unsigned count) {
  LOAD(cuLibraryLoadFromFile, cuLibraryUnload, file_globals(path), library,
       (library, path, jit_options, jit_values, jit_count, options, values, count), CUlibrary *,
       const char *, int *, void **, unsigned, int *, void **, unsigned)
}
EXPORT CUresult cuLibraryUnload(CUlibrary library) {
  void *fn = real(W_cuLibraryUnload);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  return unloaded((CUresult(*)(void *))fn, library);
}
