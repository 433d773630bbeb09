/*
 * libgpupack-cuda.so: holds a pod's processes to the pod's GPU memory share (and, where
 * asked, its compute share).
 *
 * Loaded into every process of a shared GPU container (/etc/ld.so.preload, served by the
 * node agent's CSI volume). It wraps the CUDA driver API's calls that take or give back
 * device memory, its memory queries, NVML's, and kernel launches, and nothing else
 * (entries.h):
 *
 *   - every way a process holds device memory is charged to one budget per pod and
 *     device (a file in the pod's directory, shared by all its processes and containers)
 *     and refused with CUDA_ERROR_OUT_OF_MEMORY past the pod's limit, in advance wherever
 *     the size is known before the call; what gives the memory back gives the charge back;
 *   - cuMemGetInfo, cuDeviceTotalMem and nvmlDeviceGetMemoryInfo report the limit as each
 *     device's total and the limit less the pod's usage there as free (zero when the
 *     budget cannot be kept);
 *   - with no limit configured every entry point is a pure pass-through;
 *   - kernel launches are paced to the pod's compute share beside the GPU's other pods
 *     where the pod's directory has a `compute` file (compute.c).
 *
 * This file owns the configuration. The pod's directory, GPUPACK_CUDA_DIR (default
 * /run/gpupack/cuda; the webhook sets it on every container, and a setuid program's
 * environment is never read: secure_getenv), holds `limit` (bytes, decimal; absent or 0:
 * no limit) and `budget` (budget.c). GPUPACK_CUDA_QUIET=1 silences the first-call line;
 * refusals are always said. GPUPACK_CUDA_DEBUG=1 says how each cuGetProcAddress answer
 * was matched.
 *
 * A fork child starts afresh: no slot, none of the parent's allocations, no mapping of
 * the budget, the parent's descriptor closed (so the parent's slot is released when the
 * parent dies, whatever the child does); it configures again at its first CUDA call.
 *
 * Not a security boundary: a process can bypass the dynamic loader (a static binary, a
 * RTLD_DEEPBIND or dlmopen plugin), talk to the device nodes itself, or write the budget
 * file. It keeps honest frameworks inside their share; the kernel's own limit (driver
 * >= r615) binds everyone, and the node agent reports processes that run without it.
 */
#include "shim.h"
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


struct shim shim = {.mu = PTHREAD_MUTEX_INITIALIZER};

static const char *const DEFAULT_DIR = "/run/gpupack/cuda";

/* ---- logging: one write(2) a line, never from malloc'd memory ---- */
void say(const char *fmt, ...) {
  char line[512];
  int n = snprintf(line, sizeof line, "gpupack-cuda[%d]: ", (int)getpid());
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  size_t len = (size_t)n + (m < 0 ? 0 : (size_t)m);
  if (len > sizeof line - 2) len = sizeof line - 2;
  line[len++] = '\n';
  ssize_t ignored = write(2, line, len);
  (void)ignored;
}

void human(char *out, size_t size, uint64_t bytes) {
  static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = (double)bytes;
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    unit++;
  }
  snprintf(out, size, unit ? "%.2f %s" : "%.0f %s", value, units[unit]);
}

const char *shim_getenv(const char *name) { return secure_getenv(name); }

static int flag(const char *name) {
  const char *value = shim_getenv(name);
  return value && strcmp(value, "1") == 0;
}

/* The limit file: a number of bytes. 0: none, or unreadable (no limit to keep). */
static uint64_t read_limit(const char *dir) {
  char path[300], text[64];
  snprintf(path, sizeof path, "%s/limit", dir);
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, text, sizeof text - 1);
  close(fd);
  if (n <= 0) return 0;
  text[n] = 0;
  char *end;
  errno = 0;
  unsigned long long value = strtoull(text, &end, 10);
  while (*end == ' ' || *end == '\n' || *end == '\t') end++;
  if (errno || *end || end == text || text[0] == '-') {
    say("ignoring %s: not a number of bytes", path);
    return 0;
  }
  return value;
}

static void configure_locked(void) {
  const char *dir = shim_getenv("GPUPACK_CUDA_DIR");
  snprintf(shim.dir, sizeof shim.dir, "%s", dir && *dir ? dir : DEFAULT_DIR);
  shim.quiet = flag("GPUPACK_CUDA_QUIET");
  shim.limit = read_limit(shim.dir);
  shim.active = shim.limit > 0;
  if (shim.active && budget_open(shim.dir) && !shim.quiet) {
    char limit[32];
    human(limit, sizeof limit, shim.limit);
    say("GPU memory limit %s (%" PRIu64 " bytes) for this pod, budget %s/budget, slot %d",
        limit, shim.limit, shim.dir, budget_slot());
  }
  /* A limit whose budget cannot be used stays active: every charge is refused rather
   * than run unbounded beside other pods (budget.c says why, once). */
  __atomic_store_n(&shim.state, READY, __ATOMIC_RELEASE);
}

int active(void) {
  if (__atomic_load_n(&shim.state, __ATOMIC_ACQUIRE) == READY) return shim.active;
  pthread_mutex_lock(&shim.mu);
  if (__atomic_load_n(&shim.state, __ATOMIC_RELAXED) != READY) configure_locked();
  int on = shim.active;
  pthread_mutex_unlock(&shim.mu);
  return on;
}

/* In the child of fork(2), before it runs anything else: another thread of the parent may
 * have held the lock, and nothing of the parent's is the child's. */
static void forked_child(void) {
  shim.mu = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
  budget_drop();
  memory_reset();
  pools_reset();
  vmm_reset();
  graphs_reset();
  contexts_reset();
  modules_reset();
  compute_reset();
  __atomic_store_n(&shim.state, UNCONFIGURED, __ATOMIC_RELEASE);
}

__attribute__((constructor)) static void loaded(void) {
  pthread_atfork(NULL, NULL, forked_child);
}
