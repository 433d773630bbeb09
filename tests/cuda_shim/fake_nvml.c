/* A fake NVML (libnvidia-ml.so.1) over the fake devices (fake_device.c): the calls the
 * shim and nvidia-smi-like readers make for memory, and the list of GPU processes. */
#include <stdio.h>
#include <string.h>

#include "fake_device.h"

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned pid; unsigned long long usedGpuMemory; unsigned gi, ci; } nvmlProcessInfo_t;
static int devices[FAKE_MAX_DEVICES] = {0, 1, 2, 3};
#define NVML_ERROR_INSUFFICIENT_SIZE 7

static int index_of(void *handle) { return (int)((int *)handle - devices); }
static void uuid_of(int device, char *out, unsigned length) {
  unsigned char b[16];
  for (int i = 0; i < 16; i++) b[i] = (unsigned char)(i + 16 * device);
  snprintf(out, length, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
           b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13],
           b[14], b[15]);
}

int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned *count) { *count = (unsigned)fake_devices(); return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned index, void **handle) {
  if (index >= (unsigned)fake_devices()) return 2;
  *handle = &devices[index];
  return 0;
}
int nvmlDeviceGetHandleByUUID(const char *uuid, void **handle) {
  char text[96];
  for (int d = 0; d < fake_devices(); d++) {
    uuid_of(d, text, sizeof text);
    if (strcmp(uuid, text) == 0) return *handle = &devices[d], 0;
  }
  return 6; /* NVML_ERROR_NOT_FOUND */
}
int nvmlDeviceGetUUID(void *handle, char *uuid, unsigned length) {
  uuid_of(index_of(handle), uuid, length);
  return 0;
}
int nvmlDeviceGetMemoryInfo(void *handle, nvmlMemory_t *memory) {
  int d = index_of(handle);
  memory->total = fake_device_total(d);
  memory->used = fake_device_used(d);
  memory->free = memory->used < memory->total ? memory->total - memory->used : 0;
  return 0;
}
int nvmlDeviceGetMemoryInfo_v2(void *handle, nvmlMemory_v2_t *memory) {
  int d = index_of(handle);
  memory->total = fake_device_total(d);
  memory->reserved = 64ULL << 20;
  memory->used = fake_device_used(d);
  memory->free = memory->used + memory->reserved < memory->total
                     ? memory->total - memory->used - memory->reserved : 0;
  return 0;
}
int nvmlDeviceGetComputeRunningProcesses_v3(void *handle, unsigned *count, nvmlProcessInfo_t *infos) {
  unsigned pids[512];
  unsigned long long bytes[512];
  int n = fake_device_processes(index_of(handle), pids, (uint64_t *)bytes, 512);
  if ((unsigned)n > *count) {
    *count = (unsigned)n;
    return NVML_ERROR_INSUFFICIENT_SIZE;
  }
  for (int i = 0; i < n; i++) infos[i] = (nvmlProcessInfo_t){pids[i], bytes[i], 0, 0};
  *count = (unsigned)n;
  return 0;
}
