/*
 * What the driver takes that no call says: read from NVML around the driver's call.
 *
 * The exact reading is the process's own line in NVML's list of GPU processes: the process
 * that appeared on the device while its first context was made is this one (NVML names
 * host PIDs, which a container cannot know otherwise; contexts.c remembers it). Failing
 * that (two processes starting at once, a driver that does not say), the device's used
 * memory is compared before and after, which a neighbour allocating at that moment skews:
 * such a reading is capped at MEASURE_CAP.
 */
#include "shim.h"
#include <stdio.h>

#define MEASURE_CAP (1ULL << 30)

nvmlDevice_t nvml_device(int ordinal) {
  typedef CUresult (*uuid_fn)(CUuuid *, CUdevice);
  typedef nvmlReturn_t (*init_fn)(void);
  typedef nvmlReturn_t (*by_uuid_fn)(const char *, nvmlDevice_t *);
  uuid_fn get_uuid = DRIVER(uuid_fn, "cuDeviceGetUuid_v2");
  if (!get_uuid) get_uuid = DRIVER(uuid_fn, "cuDeviceGetUuid");
  init_fn init = DRIVER(init_fn, "nvmlInit_v2");
  by_uuid_fn by_uuid = DRIVER(by_uuid_fn, "nvmlDeviceGetHandleByUUID");
  CUuuid id;
  if (!get_uuid || !init || !by_uuid || get_uuid(&id, ordinal) != CUDA_SUCCESS ||
      init() != NVML_SUCCESS)
    return NULL;
  char text[64];
  const unsigned char *u = id.bytes;
  snprintf(text, sizeof text,
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0],
           u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
           u[14], u[15]);
  nvmlDevice_t device;
  return by_uuid(text, &device) == NVML_SUCCESS ? device : NULL;
}

void read_nvml(nvmlDevice_t device, unsigned host_pid, struct reading *r) {
  typedef nvmlReturn_t (*info_fn)(nvmlDevice_t, nvmlMemory_t *);
  typedef nvmlReturn_t (*list_fn)(nvmlDevice_t, unsigned *, nvmlProcessInfo_t *);
  r->device_ok = r->own_ok = 0, r->count = 0;
  if (!device) return;
  info_fn info = (info_fn)real(W_nvmlDeviceGetMemoryInfo);
  nvmlMemory_t memory;
  if (info && info(device, &memory) == NVML_SUCCESS) r->device_ok = 1, r->device_used = memory.used;
  list_fn list = DRIVER(list_fn, "nvmlDeviceGetComputeRunningProcesses_v3");
  if (!list) list = DRIVER(list_fn, "nvmlDeviceGetComputeRunningProcesses_v2");
  unsigned count = MAX_PROCESSES;
  if (!list || list(device, &count, r->processes) != NVML_SUCCESS) return;
  r->count = count < MAX_PROCESSES ? count : MAX_PROCESSES;
  for (unsigned i = 0; host_pid && i < r->count; i++)
    if (r->processes[i].pid == host_pid && r->processes[i].usedGpuMemory != ~0ULL)
      r->own_ok = 1, r->own_used = r->processes[i].usedGpuMemory;
}

/* The one process on the device after that was not there before: this one. */
unsigned newcomer(const struct reading *before, const struct reading *after) {
  unsigned found = 0, seen = 0;
  for (unsigned i = 0; i < after->count; i++) {
    int old = 0;
    for (unsigned j = 0; j < before->count && !old; j++)
      old = before->processes[j].pid == after->processes[i].pid;
    if (!old) found = after->processes[i].pid, seen++;
  }
  return seen == 1 ? found : 0;
}

/* What the call took: exact from the process's own line, else the device's growth,
 * capped. `exact` says which. */
uint64_t took(const struct reading *before, const struct reading *after, int *exact) {
  *exact = before->own_ok && after->own_ok;
  if (*exact) return after->own_used > before->own_used ? after->own_used - before->own_used : 0;
  if (!before->device_ok || !after->device_ok || after->device_used <= before->device_used)
    return 0;
  uint64_t grew = after->device_used - before->device_used;
  return grew < MEASURE_CAP ? grew : MEASURE_CAP;
}
