/* The fake GPUs' memory, shared by a test's processes through FAKE_CUDA_STATE: per device,
 * a slot per process (pid, bytes, whether it has a context there); a slot whose process
 * is gone is free again, as the driver frees what a dead process held. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_device.h"

#define PROCS 512
struct state {
  uint64_t peak[FAKE_MAX_DEVICES];
  struct {
    int32_t pid;
    uint32_t joined; /* a bit per device */
    uint64_t bytes[FAKE_MAX_DEVICES];
  } proc[PROCS];
};
static struct state local, *shared;
static int fd = -1;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

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

static struct state *open_shared(void) {
  const char *path = getenv("FAKE_CUDA_STATE");
  if (!path) return shared = &local;
  fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0 || ftruncate(fd, sizeof(struct state)) < 0) return shared = &local;
  void *map = mmap(NULL, sizeof(struct state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return shared = map == MAP_FAILED ? &local : map;
}

/* flock excludes other processes; the mutex, this process's other threads. */
static struct state *lock(void) {
  pthread_mutex_lock(&mu);
  struct state *s = shared ? shared : open_shared();
  if (fd >= 0) while (flock(fd, LOCK_EX) < 0 && errno == EINTR) {}
  return s;
}
static void unlock(void) {
  if (fd >= 0) flock(fd, LOCK_UN);
  pthread_mutex_unlock(&mu);
}

static void forget_dead(struct state *s) {
  for (int i = 0; i < PROCS; i++)
    if (s->proc[i].pid && s->proc[i].pid != getpid() && kill(s->proc[i].pid, 0) < 0 &&
        errno == ESRCH)
      memset(&s->proc[i], 0, sizeof s->proc[i]); /* its process died: the driver freed it */
}

static uint64_t used_locked(struct state *s, int device) {
  forget_dead(s);
  uint64_t used = 0;
  for (int i = 0; i < PROCS; i++)
    if (s->proc[i].pid) used += s->proc[i].bytes[device];
  return used;
}

static int mine(struct state *s) {
  for (int i = 0; i < PROCS; i++)
    if (s->proc[i].pid == getpid()) return i;
  for (int i = 0; i < PROCS; i++)
    if (!s->proc[i].pid) {
      memset(&s->proc[i], 0, sizeof s->proc[i]);
      s->proc[i].pid = getpid();
      return i;
    }
  return -1;
}

static int change(int device, int64_t bytes, int check) {
  if (device < 0 || device >= FAKE_MAX_DEVICES) return 0;
  struct state *s = lock();
  uint64_t used = used_locked(s, device);
  int ok = !check || bytes <= 0 || used + (uint64_t)bytes <= fake_device_total(device);
  int i = ok ? mine(s) : -1;
  if (i >= 0) {
    uint64_t *held = &s->proc[i].bytes[device];
    *held = (int64_t)*held + bytes < 0 ? 0 : *held + (uint64_t)bytes;
    if (bytes > 0 && used + (uint64_t)bytes > s->peak[device])
      s->peak[device] = used + (uint64_t)bytes;
  }
  unlock();
  return i >= 0;
}

int fake_device_take(int device, uint64_t bytes) { return change(device, (int64_t)bytes, 1); }
void fake_device_take_anyway(int device, uint64_t bytes) { change(device, (int64_t)bytes, 0); }
void fake_device_give(int device, uint64_t bytes) { change(device, -(int64_t)bytes, 0); }

void fake_device_join(int device) {
  struct state *s = lock();
  int i = mine(s);
  if (i >= 0) s->proc[i].joined |= 1u << device;
  unlock();
}

uint64_t fake_device_used(int device) {
  struct state *s = lock();
  uint64_t used = used_locked(s, device);
  unlock();
  return used;
}

uint64_t fake_device_peak(int device) {
  struct state *s = lock();
  uint64_t peak = s->peak[device];
  unlock();
  return peak;
}

int fake_device_processes(int device, unsigned *pids, uint64_t *bytes, int max) {
  struct state *s = lock();
  forget_dead(s);
  int n = 0;
  for (int i = 0; i < PROCS; i++) {
    if (!s->proc[i].pid || !(s->proc[i].joined & (1u << device))) continue;
    if (n < max) pids[n] = (unsigned)s->proc[i].pid, bytes[n] = s->proc[i].bytes[device];
    n++;
  }
  unlock();
  return n;
}
