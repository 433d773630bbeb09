/* A fake NVML (libnvidia-ml.so.1) over the fake device (fake_device.c): the calls the
 * shim and nvidia-smi-like readers make for memory. */
#include <stdio.h>
#include <string.h>

#include "fake_device.h"

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
static int device;
#define UUID "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"

int nvmlInit_v2(void) { return 0; }
int nvmlShutdown(void) { return 0; }
int nvmlDeviceGetCount_v2(unsigned *count) { *count = 1; return 0; }
int nvmlDeviceGetHandleByIndex_v2(unsigned index, void **handle) { *handle = &device; return index ? 2 : 0; }
int nvmlDeviceGetHandleByUUID(const char *uuid, void **handle) {
  *handle = &device;
  return strcmp(uuid, UUID) ? 6 /* NVML_ERROR_NOT_FOUND */ : 0;
}
int nvmlDeviceGetUUID(void *handle, char *uuid, unsigned length) {
  (void)handle;
  snprintf(uuid, length, "%s", UUID);
  return 0;
}
int nvmlDeviceGetMemoryInfo(void *handle, nvmlMemory_t *memory) {
  (void)handle;
  memory->total = fake_device_total();
  memory->used = fake_device_used();
  memory->free = memory->used < memory->total ? memory->total - memory->used : 0;
  return 0;
}
int nvmlDeviceGetMemoryInfo_v2(void *handle, nvmlMemory_v2_t *memory) {
  (void)handle;
  memory->total = fake_device_total();
  memory->reserved = 64ULL << 20;
  memory->used = fake_device_used();
  memory->free = memory->used + memory->reserved < memory->total
                     ? memory->total - memory->used - memory->reserved : 0;
  return 0;
}
