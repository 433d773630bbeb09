/* One fake device's memory, shared by a test's processes through FAKE_CUDA_STATE: a
 * slot per process (pid, bytes); a slot whose process is gone is free again. */
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
struct state { uint64_t peak; struct { int32_t pid; uint64_t bytes; } proc[PROCS]; };
static struct state local, *shared;
static int fd = -1;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static uint64_t env_bytes(const char *name, uint64_t fallback) {
  const char *text = getenv(name);
  return text && *text ? strtoull(text, NULL, 10) : fallback;
}
uint64_t fake_device_total(void) { return env_bytes("FAKE_CUDA_TOTAL", 80ULL << 30); }
uint64_t fake_device_context_bytes(void) { return env_bytes("FAKE_CUDA_CONTEXT", 300ULL << 20); }

static struct state *open_shared(void);
static struct state *open_state(void) {
  pthread_mutex_lock(&mu);
  struct state *s = shared ? shared : open_shared();
  pthread_mutex_unlock(&mu);
  return s;
}

static struct state *open_shared(void) {
  const char *path = getenv("FAKE_CUDA_STATE");
  if (!path) return shared = &local;
  fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0 || ftruncate(fd, sizeof(struct state)) < 0) return shared = &local;
  void *map = mmap(NULL, sizeof(struct state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return shared = map == MAP_FAILED ? &local : map;
}

/* flock excludes other processes; the mutex, this process's other threads. */
static void lock(void) {
  pthread_mutex_lock(&mu);
  if (fd >= 0) while (flock(fd, LOCK_EX) < 0 && errno == EINTR) {}
}
static void unlock(void) {
  if (fd >= 0) flock(fd, LOCK_UN);
  pthread_mutex_unlock(&mu);
}

static uint64_t used_locked(struct state *s) {
  uint64_t used = 0;
  for (int i = 0; i < PROCS; i++) {
    if (!s->proc[i].pid) continue;
    if (s->proc[i].pid != getpid() && kill(s->proc[i].pid, 0) < 0 && errno == ESRCH)
      s->proc[i].pid = 0, s->proc[i].bytes = 0; /* its process died: the driver freed it */
    else
      used += s->proc[i].bytes;
  }
  return used;
}

static int64_t *mine(struct state *s) {
  for (int i = 0; i < PROCS; i++)
    if (s->proc[i].pid == getpid()) return (int64_t *)&s->proc[i].bytes;
  for (int i = 0; i < PROCS; i++)
    if (!s->proc[i].pid) { s->proc[i].pid = getpid(); s->proc[i].bytes = 0; return (int64_t *)&s->proc[i].bytes; }
  return NULL;
}

static int change(int64_t bytes, int check) {
  struct state *s = open_state();
  lock();
  uint64_t used = used_locked(s);
  int ok = !check || bytes <= 0 || used + (uint64_t)bytes <= fake_device_total();
  int64_t *held = ok ? mine(s) : NULL;
  if (held) *held = *held + bytes < 0 ? 0 : *held + bytes;
  if (held && bytes > 0 && used + (uint64_t)bytes > s->peak) s->peak = used + (uint64_t)bytes;
  unlock();
  return ok && held;
}

int fake_device_take(uint64_t bytes) { return change((int64_t)bytes, 1); }
void fake_device_take_anyway(uint64_t bytes) { change((int64_t)bytes, 0); }
void fake_device_give(uint64_t bytes) { change(-(int64_t)bytes, 0); }
uint64_t fake_device_used(void) {
  struct state *s = open_state();
  lock();
  uint64_t used = used_locked(s);
  unlock();
  return used;
}
uint64_t fake_device_peak(void) {
  struct state *s = open_state();
  lock();
  uint64_t peak = s->peak;
  unlock();
  return peak;
}
