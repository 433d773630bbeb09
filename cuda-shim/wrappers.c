/* Our function for each entry of entries.h, by its exported name: what dlsym and
 * cuGetProcAddress hand out in place of the driver's. */
#include "shim.h"

#define ENTRY(name, base, since, ptds) extern char addr_##name[] __asm__(#name);
#include "entries.h"
#undef ENTRY

void *wrapper(int which) {
  switch (which) {
#define ENTRY(name, base, since, ptds) \
  case W_##name:                       \
    return (void *)addr_##name;
#include "entries.h"
#undef ENTRY
    default:
      return 0;
  }
}
