/* The fake GPUs' clock: kernels that take time, for the compute pacing's tests.
 *
 * With FAKE_CUDA_KERNEL_US set (each process its own: how long each of its kernels runs
 * alone on the device), every launch adds that much work to its context's queue. A device
 * runs one context at a time, round robin between the contexts with work, in slices short
 * enough to model exactly as processor sharing: over any interval, each of the k contexts
 * with work gets 1/k of the device (the time-slicing a GPU does without MPS). A context
 * with more than FAKE_CUDA_QUEUE kernels (default 4) waiting blocks its next launch until
 * one is done, as a full push buffer does. Events and synchronizations wait for the work
 * before them. A process that dies loses its queue, as the driver drops a dead context's.
 *
 * The device is a file every process of a test maps (FAKE_CUDA_CLOCK). Its lock is a word
 * holding the owner's pid: a dead or stopped owner's is taken over (the tests SIGKILL and
 * SIGSTOP processes, and never resume a stopped one). Without FAKE_CUDA_KERNEL_US,
 * kernels take no time.
 *
 * fake_gpu_ns(device) (not a driver function) says how much device time the calling process's
 * kernels have had, so a test reads what the device gave, not what the shim thinks. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "fake_cuda.h"

#define CONTEXTS 64
struct clock_state {
  int32_t lock; /* the owner's pid, 0: free */
  int32_t unused;
  uint64_t last[FAKE_MAX_DEVICES]; /* CLOCK_MONOTONIC ns the device was advanced to */
  struct {
    int32_t pid; /* 0: free */
    int32_t device;
    uint64_t queued, done; /* ns of work: ever queued, done */
  } context[CONTEXTS];
};
static struct clock_state local_clock, *clock_map;
static pthread_once_t clock_once = PTHREAD_ONCE_INIT;

static uint64_t env_number(const char *name, uint64_t fallback) {
  const char *text = getenv(name);
  return text && *text ? strtoull(text, NULL, 10) : fallback;
}
uint64_t fake_kernel_ns(void) { return env_number("FAKE_CUDA_KERNEL_US", 0) * 1000; }

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ULL + (uint64_t)t.tv_nsec;
}

static void open_clock(void) {
  clock_map = &local_clock;
  const char *path = getenv("FAKE_CUDA_CLOCK");
  if (!path) return;
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0666);
  if (fd < 0) return;
  if (ftruncate(fd, sizeof(struct clock_state)) == 0) {
    void *map = mmap(NULL, sizeof(struct clock_state), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map != MAP_FAILED) clock_map = map;
  }
  close(fd);
}

static int gone(int32_t pid) { return pid > 0 && kill(pid, 0) < 0 && errno == ESRCH; }

/* Stopped (SIGSTOP): the tests never resume such a process, so its lock is taken over. */
static int stopped(int32_t pid) {
  char path[64], text[256];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, text, sizeof text - 1);
  close(fd);
  if (n <= 0) return 0;
  text[n] = 0;
  const char *end = strrchr(text, ')');
  return end && end[1] == ' ' && (end[2] == 'T' || end[2] == 't');
}

static struct clock_state *lock_clock(void) {
  pthread_once(&clock_once, open_clock);
  struct clock_state *s = clock_map;
  int32_t self = (int32_t)getpid();
  for (unsigned spins = 0;; spins++) {
    int32_t owner = 0;
    if (__atomic_compare_exchange_n(&s->lock, &owner, self, 0, __ATOMIC_ACQUIRE,
                                    __ATOMIC_RELAXED))
      return s;
    if (spins % 64 == 63 && (gone(owner) || stopped(owner)))
      __atomic_compare_exchange_n(&s->lock, &owner, 0, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
    if (spins % 16 == 15) usleep(20);
  }
}
static void unlock_clock(struct clock_state *s) { __atomic_store_n(&s->lock, 0, __ATOMIC_RELEASE); }

/* Runs the device from its last time to now: the contexts with work share it equally. */
static void advance(struct clock_state *s, int device, uint64_t now) {
  uint64_t last = s->last[device];
  s->last[device] = now;
  if (!last || now <= last) return;
  uint64_t spare = now - last;
  while (spare) {
    uint64_t k = 0, least = UINT64_MAX;
    for (int i = 0; i < CONTEXTS; i++) {
      if (!s->context[i].pid || s->context[i].device != device) continue;
      uint64_t left = s->context[i].queued - s->context[i].done;
      if (!left) continue;
      k++;
      if (left < least) least = left;
    }
    if (!k) return;
    uint64_t each = spare / k < least ? spare / k : least;
    if (!each) return;
    for (int i = 0; i < CONTEXTS; i++)
      if (s->context[i].pid && s->context[i].device == device &&
          s->context[i].queued > s->context[i].done)
        s->context[i].done += each;
    spare -= each * k;
  }
}

/* The calling process's context on `device`, made on first use; dead ones are dropped. */
static int context_of(struct clock_state *s, int device) {
  int32_t self = (int32_t)getpid();
  int found = -1;
  for (int i = 0; i < CONTEXTS; i++) {
    if (s->context[i].pid == self && s->context[i].device == device) return i;
    if (s->context[i].pid && gone(s->context[i].pid)) s->context[i].pid = 0;
  }
  for (int i = 0; i < CONTEXTS && found < 0; i++)
    if (!s->context[i].pid) found = i;
  if (found >= 0) {
    s->context[found].pid = self, s->context[found].device = device;
    s->context[found].queued = s->context[found].done = 0;
  }
  return found;
}

/* Reads or changes the calling process's context under the lock, the device advanced. */
static uint64_t visit(int device, uint64_t add, int which) {
  if (device < 0 || device >= FAKE_MAX_DEVICES) return 0;
  struct clock_state *s = lock_clock();
  advance(s, device, now_ns());
  int i = context_of(s, device);
  uint64_t value = 0;
  if (i >= 0) {
    s->context[i].queued += add;
    value = which == 0 ? s->context[i].queued - s->context[i].done
            : which == 1 ? s->context[i].queued
                         : s->context[i].done;
  }
  unlock_clock(s);
  return value;
}

void fake_clock_launch(int device) {
  uint64_t kernel = fake_kernel_ns();
  if (!kernel) return;
  uint64_t queue = env_number("FAKE_CUDA_QUEUE", 4);
  while (visit(device, 0, 0) > queue * kernel) usleep(50);
  visit(device, kernel, 0);
}
uint64_t fake_clock_mark(int device) { return fake_kernel_ns() ? visit(device, 0, 1) : 0; }
int fake_clock_reached(int device, uint64_t mark) {
  return !fake_kernel_ns() || visit(device, 0, 2) >= mark;
}
void fake_clock_drain(int device) {
  if (!fake_kernel_ns()) return;
  while (visit(device, 0, 0)) usleep(50);
}

/* Not a driver function: the device time this process's kernels had on `device`. */
uint64_t fake_gpu_ns(int device) { return fake_kernel_ns() ? visit(device, 0, 2) : 0; }

/* ---- events: each waits for the work queued before it was recorded ---- */
struct fake_event {
  int device;
  uint64_t mark;
};
CUresult cuEventCreate(void **event, unsigned flags) {
  CALLED;
  (void)flags;
  struct fake_event *e = calloc(1, sizeof *e);
  if (!e) return OOM;
  *event = e;
  return OK;
}
CUresult cuEventDestroy_v2(void *event) {
  CALLED;
  free(event);
  return OK;
}
CUresult cuEventDestroy(void *event) { return cuEventDestroy_v2(event); }
CUresult cuEventRecord(void *event, void *stream) {
  CALLED;
  (void)stream;
  if (!event) return INVALID;
  struct fake_event *e = event;
  e->device = current_device() < 0 ? 0 : current_device();
  e->mark = fake_clock_mark(e->device);
  return OK;
}
CUresult cuEventRecord_ptsz(void *event, void *stream) { return cuEventRecord(event, stream); }
CUresult cuEventQuery(void *event) {
  CALLED;
  if (!event) return INVALID;
  struct fake_event *e = event;
  return fake_clock_reached(e->device, e->mark) ? OK : NOT_READY;
}
CUresult cuEventSynchronize(void *event) {
  CALLED;
  if (!event) return INVALID;
  struct fake_event *e = event;
  while (!fake_clock_reached(e->device, e->mark)) usleep(50);
  return OK;
}
