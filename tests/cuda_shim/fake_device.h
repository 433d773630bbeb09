/* The fake GPU both fakes share (fake_device.c): one device's memory, in a file. */
#include <stdint.h>
int fake_device_take(uint64_t bytes);          /* 0: the device is full */
void fake_device_take_anyway(uint64_t bytes);
void fake_device_give(uint64_t bytes);
uint64_t fake_device_total(void);
uint64_t fake_device_used(void);               /* every live process's */
uint64_t fake_device_context_bytes(void);
uint64_t fake_device_peak(void);               /* the most ever in use at once */
