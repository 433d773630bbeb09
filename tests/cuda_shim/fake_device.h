/* The fake GPUs both fakes share (fake_device.c): each device's memory, in a file. */
#include <stdint.h>
#define FAKE_MAX_DEVICES 4
int fake_devices(void);                            /* FAKE_CUDA_DEVICES, 1 to 4 */
int fake_device_take(int device, uint64_t bytes);  /* 0: the device is full */
void fake_device_take_anyway(int device, uint64_t bytes);
void fake_device_give(int device, uint64_t bytes);
void fake_device_join(int device);                 /* this process has a context there */
uint64_t fake_device_total(int device);
uint64_t fake_device_used(int device);             /* every live process's */
uint64_t fake_device_context_bytes(void);
uint64_t fake_device_peak(int device);             /* the most ever in use at once */
/* The live processes on a device (NVML's list): how many, up to `max`. */
int fake_device_processes(int device, unsigned *pids, uint64_t *bytes, int max);
