/*
 * What the pod sees: each device's total is the pod's limit (never more than the device),
 * its free memory the limit less what the pod's processes hold on that device (never more
 * than the device really has free). A process whose budget cannot be used is told zero
 * free: everything it asks for would be refused, so frameworks that size themselves from
 * free memory (vLLM, JAX) stop at once with their own clear error instead of failing later.
 *
 * cuMemGetInfo answers for the calling thread's device, cuDeviceTotalMem for the one
 * named, NVML for the handle's (by its UUID), both ABIs of each.
 */
#include "shim.h"
#include <stdio.h>
#include <string.h>


static void shown(int index, uint64_t *free_bytes, uint64_t *total) {
  if (*total > shim.limit) *total = shim.limit;
  if (!budget_usable() || index < 0) {
    *free_bytes = 0;
    return;
  }
  uint64_t used = pod_used(index);
  uint64_t left = used < *total ? *total - used : 0;
  if (*free_bytes > left) *free_bytes = left;
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
  typedef CUresult (*fn_t)(size_t *, size_t *);
  fn_t fn = REAL(cuMemGetInfo_v2, fn_t);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  size_t free_real = 0, total_real = 0;
  CUresult rc = fn(&free_real, &total_real);
  if (rc == CUDA_SUCCESS && active()) {
    uint64_t f = free_real, t = total_real;
    shown(current_index(), &f, &t);
    free_real = f, total_real = t;
  }
  if (rc == CUDA_SUCCESS && free_bytes) *free_bytes = free_real;
  if (rc == CUDA_SUCCESS && total_bytes) *total_bytes = total_real;
  return rc;
}

EXPORT CUresult cuMemGetInfo(unsigned *free_bytes, unsigned *total_bytes) {
  typedef CUresult (*fn_t)(unsigned *, unsigned *);
  fn_t fn = REAL(cuMemGetInfo, fn_t);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  unsigned free_real = 0, total_real = 0;
  CUresult rc = fn(&free_real, &total_real);
  if (rc == CUDA_SUCCESS && active()) {
    uint64_t f = free_real, t = total_real;
    shown(current_index(), &f, &t);
    free_real = (unsigned)f, total_real = (unsigned)t;
  }
  if (rc == CUDA_SUCCESS && free_bytes) *free_bytes = free_real;
  if (rc == CUDA_SUCCESS && total_bytes) *total_bytes = total_real;
  return rc;
}

EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device) {
  typedef CUresult (*fn_t)(size_t *, CUdevice);
  fn_t fn = REAL(cuDeviceTotalMem_v2, fn_t);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  CUresult rc = fn(bytes, device);
  if (rc == CUDA_SUCCESS && bytes && active() && *bytes > shim.limit) *bytes = shim.limit;
  return rc;
}

EXPORT CUresult cuDeviceTotalMem(unsigned *bytes, CUdevice device) {
  typedef CUresult (*fn_t)(unsigned *, CUdevice);
  fn_t fn = REAL(cuDeviceTotalMem, fn_t);
  if (!fn) return CUDA_ERROR_NOT_FOUND;
  CUresult rc = fn(bytes, device);
  if (rc == CUDA_SUCCESS && bytes && active() && *bytes > shim.limit) *bytes = (unsigned)shim.limit;
  return rc;
}

/* ---- NVML: the device a handle names, by its UUID ---- */
static int hex(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

static int nvml_index(nvmlDevice_t device) {
  typedef nvmlReturn_t (*uuid_fn)(nvmlDevice_t, char *, unsigned);
  uuid_fn get = DRIVER(uuid_fn, "nvmlDeviceGetUUID");
  char text[96];
  unsigned char uuid[16];
  if (!get || get(device, text, sizeof text) != NVML_SUCCESS || strncmp(text, "GPU-", 4) != 0)
    return current_index();
  int n = 0;
  for (const char *p = text + 4; *p && n < 32; p++) {
    if (*p == '-') continue;
    int digit = hex(*p);
    if (digit < 0) return current_index();
    if (n % 2 == 0) uuid[n / 2] = (unsigned char)(digit << 4);
    else uuid[n / 2] |= (unsigned char)digit;
    n++;
  }
  return n == 32 ? device_index_by_uuid(uuid) : current_index();
}

static void show_nvml(nvmlDevice_t device, unsigned long long *total,
                      unsigned long long *free_bytes, unsigned long long *used) {
  int index = nvml_index(device);
  uint64_t t = *total, f = *free_bytes;
  shown(index, &f, &t);
  *total = t, *free_bytes = f;
  *used = budget_usable() && index >= 0 ? pod_used(index) : 0;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
  typedef nvmlReturn_t (*fn_t)(nvmlDevice_t, nvmlMemory_t *);
  fn_t fn = REAL(nvmlDeviceGetMemoryInfo, fn_t);
  if (!fn) return NVML_ERROR_NOT_SUPPORTED;
  nvmlReturn_t rc = fn(device, memory);
  if (rc == NVML_SUCCESS && memory && active())
    show_nvml(device, &memory->total, &memory->free, &memory->used);
  return rc;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
  typedef nvmlReturn_t (*fn_t)(nvmlDevice_t, nvmlMemory_v2_t *);
  fn_t fn = REAL(nvmlDeviceGetMemoryInfo_v2, fn_t);
  if (!fn) return NVML_ERROR_NOT_SUPPORTED;
  nvmlReturn_t rc = fn(device, memory);
  if (rc == NVML_SUCCESS && memory && active()) {
    show_nvml(device, &memory->total, &memory->free, &memory->used);
    memory->reserved = 0;
  }
  return rc;
}
