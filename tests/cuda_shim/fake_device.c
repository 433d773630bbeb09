/* The fake GPUs' memory, shared by a test's processes through FAKE_CUDA_STATE: per device,
 * a slot per process (pid, bytes, whether it has a context there); a slot whose process
 * is gone is free again, as the driver frees what a dead process held.
 *
 * No lock between processes, as the real driver keeps none a process could hold in user
 * space: a process stopped at any moment (a test sends SIGSTOP) must never stall the
 * others here either, or the tests would measure the double, not the shim. Each device
 * keeps one atomic total beside each process's own count: a take adds to both and takes
 * back past the device's size, so the total (and its peak) is exact at every moment. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_device.h"

#define PROCS 512
#define RECLAIMING (-1)
struct state {
  uint64_t peak[FAKE_MAX_DEVICES];
  uint64_t total[FAKE_MAX_DEVICES]; /* every live process's bytes */
  struct {
    int32_t pid; /* 0: free; RECLAIMING: being emptied */
    uint32_t joined; /* a bit per device */
    uint64_t bytes[FAKE_MAX_DEVICES];
  } proc[PROCS];
};
static struct state local, *shared;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static __thread int mine_cached = -1;
static pid_t mine_pid;

static uint64_t env_bytes(const char *name, uint64_t fallback) {
  const char *text = getenv(name);
  return text && *text ? strtoull(text, NULL, 10) : fallback;
}
int fake_devices(void) {
  uint64_t n = env_bytes("FAKE_CUDA_DEVICES", 1);
  return n < 1 ? 1 : n > FAKE_MAX_DEVICES ? FAKE_MAX_DEVICES : (int)n;
}
uint64_t fake_device_total(int device) {
  (void)device;
  return env_bytes("FAKE_CUDA_TOTAL", 80ULL << 30);
}
uint64_t fake_device_context_bytes(void) { return env_bytes("FAKE_CUDA_CONTEXT", 300ULL << 20); }

static void open_shared(void) {
  const char *path = getenv("FAKE_CUDA_STATE");
  shared = &local;
  if (!path) return;
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) return;
  if (ftruncate(fd, sizeof(struct state)) == 0) {
    void *map = mmap(NULL, sizeof(struct state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map != MAP_FAILED) shared = map;
  }
  close(fd);
}

static struct state *state(void) {
  pthread_once(&once, open_shared);
  return shared;
}

static int dead(int32_t pid) { return pid > 0 && kill(pid, 0) < 0 && errno == ESRCH; }

/* Empties the slot of a process that died (its memory is the device's again). */
static void reclaim(struct state *s, int i, pid_t self) {
  int32_t pid = __atomic_load_n(&s->proc[i].pid, __ATOMIC_ACQUIRE);
  if (pid <= 0 || pid == self || !dead(pid)) return;
  if (!__atomic_compare_exchange_n(&s->proc[i].pid, &pid, RECLAIMING, 0, __ATOMIC_ACQ_REL,
                                   __ATOMIC_ACQUIRE))
    return;
  for (int d = 0; d < FAKE_MAX_DEVICES; d++)
    __atomic_fetch_sub(&s->total[d], __atomic_exchange_n(&s->proc[i].bytes[d], 0, __ATOMIC_SEQ_CST),
                       __ATOMIC_SEQ_CST);
  __atomic_store_n(&s->proc[i].joined, 0, __ATOMIC_RELAXED);
  __atomic_store_n(&s->proc[i].pid, 0, __ATOMIC_RELEASE);
}

static int mine(struct state *s) {
  if (mine_cached >= 0 && mine_pid == getpid()) return mine_cached;
  int found = -1;
  for (int i = 0; i < PROCS && found < 0; i++)
    if (__atomic_load_n(&s->proc[i].pid, __ATOMIC_ACQUIRE) == getpid()) found = i;
  pid_t self = getpid();
  for (int i = 0; i < PROCS && found < 0; i++) {
    reclaim(s, i, self);
    int32_t expected = 0;
    if (__atomic_compare_exchange_n(&s->proc[i].pid, &expected, getpid(), 0, __ATOMIC_ACQ_REL,
                                    __ATOMIC_ACQUIRE)) {
      __atomic_store_n(&s->proc[i].joined, 0, __ATOMIC_RELAXED); /* its bytes were emptied */
      found = i;
    }
  }
  mine_cached = found, mine_pid = getpid();
  return found;
}

static uint64_t used_now(struct state *s, int device) {
  pid_t self = getpid();
  for (int i = 0; i < PROCS; i++) reclaim(s, i, self);
  return __atomic_load_n(&s->total[device], __ATOMIC_SEQ_CST);
}

static int change(int device, int64_t bytes, int check) {
  if (device < 0 || device >= FAKE_MAX_DEVICES) return 0;
  struct state *s = state();
  int i = mine(s);
  if (i < 0) return 0;
  uint64_t *held = &s->proc[i].bytes[device];
  if (bytes <= 0) {
    uint64_t now = __atomic_load_n(held, __ATOMIC_RELAXED), next;
    do next = now > (uint64_t)-bytes ? now - (uint64_t)-bytes : 0;
    while (!__atomic_compare_exchange_n(held, &now, next, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
    __atomic_fetch_sub(&s->total[device], now - next, __ATOMIC_SEQ_CST);
    return 1;
  }
  if (check) used_now(s, device); /* what dead processes held is free again */
  __atomic_fetch_add(held, (uint64_t)bytes, __ATOMIC_SEQ_CST);
  uint64_t used = __atomic_add_fetch(&s->total[device], (uint64_t)bytes, __ATOMIC_SEQ_CST);
  if (check && used > fake_device_total(device)) {
    __atomic_fetch_sub(held, (uint64_t)bytes, __ATOMIC_SEQ_CST);
    __atomic_fetch_sub(&s->total[device], (uint64_t)bytes, __ATOMIC_SEQ_CST);
    return 0;
  }
  uint64_t peak = __atomic_load_n(&s->peak[device], __ATOMIC_RELAXED);
  while (used > peak && !__atomic_compare_exchange_n(&s->peak[device], &peak, used, 0,
                                                      __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return 1;
}

int fake_device_take(int device, uint64_t bytes) { return change(device, (int64_t)bytes, 1); }
void fake_device_take_anyway(int device, uint64_t bytes) { change(device, (int64_t)bytes, 0); }
void fake_device_give(int device, uint64_t bytes) { change(device, -(int64_t)bytes, 0); }

void fake_device_join(int device) {
  struct state *s = state();
  int i = mine(s);
  if (i >= 0) __atomic_fetch_or(&s->proc[i].joined, 1u << device, __ATOMIC_RELAXED);
}

uint64_t fake_device_used(int device) { return used_now(state(), device); }

uint64_t fake_device_peak(int device) {
  return __atomic_load_n(&state()->peak[device], __ATOMIC_RELAXED);
}

int fake_device_processes(int device, unsigned *pids, uint64_t *bytes, int max) {
  struct state *s = state();
  int n = 0;
  pid_t self = getpid();
  for (int i = 0; i < PROCS; i++) {
    reclaim(s, i, self);
    int32_t pid = __atomic_load_n(&s->proc[i].pid, __ATOMIC_ACQUIRE);
    if (pid <= 0 || !(__atomic_load_n(&s->proc[i].joined, __ATOMIC_RELAXED) & (1u << device)))
      continue;
    if (n < max) pids[n] = (unsigned)pid, bytes[n] = __atomic_load_n(&s->proc[i].bytes[device], __ATOMIC_SEQ_CST);
    n++;
  }
  return n;
}
