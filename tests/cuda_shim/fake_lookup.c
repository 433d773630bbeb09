/* The fake driver's cuGetProcAddress: a name and the ABI version the caller was built for
 * (fake_table.h), answered with the exported function of that ABI, as the real driver
 * answers; "cuGraphInstantiate" from 12.0 is cuGraphInstantiateWithFlags there too. With
 * FAKE_CUDA_INTERNAL=1 it answers with internal addresses instead (a jump to the same
 * function), as a driver may that keeps its entry points apart from its exports. */
#include "fake_cuda.h"

#include <stdlib.h>
#include <string.h>

#define F(base, since, ptds, fn) extern char fn_##fn[] __asm__(#fn);
#include "fake_table.h"
#undef F

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags);
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags,
                             int *status);

#define F(base, since, ptds, fn) \
  __attribute__((naked, used)) static void internal_##fn##_##since(void) { __asm__("jmp " #fn); }
#include "fake_table.h"
#undef F

static const struct {
  const char *name;
  int since, ptds;
  void *fn, *internal;
} table[] = {
#define F(base, since, ptds, fn) {base, since, ptds, (void *)fn_##fn, (void *)internal_##fn##_##since},
#include "fake_table.h"
#undef F
    {"cuGetProcAddress", 11030, 0, (void *)cuGetProcAddress, (void *)cuGetProcAddress},
    {"cuGetProcAddress", 12000, 0, (void *)cuGetProcAddress_v2, (void *)cuGetProcAddress_v2},
};

static CUresult lookup(const char *symbol, void **pfn, int version, unsigned long long flags) {
  int best = -1, best_score = -1;
  for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
    if (strcmp(table[i].name, symbol) || table[i].since > version) continue;
    if (table[i].ptds && !(flags & 2)) continue;
    int score = table[i].since * 2 + table[i].ptds;
    if (score > best_score) best = (int)i, best_score = score;
  }
  const char *internal = getenv("FAKE_CUDA_INTERNAL");
  *pfn = best < 0 ? NULL : internal && *internal == '1' ? table[best].internal : table[best].fn;
  return best < 0 ? NOT_FOUND : OK;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags) {
  CALLED;
  return lookup(symbol, pfn, version, flags);
}
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags,
                             int *status) {
  CALLED;
  CUresult rc = lookup(symbol, pfn, version, flags);
  if (status) *status = rc == OK ? 0 : 1;
  return rc;
}
