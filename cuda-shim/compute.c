/*
 * Compute shares: when several pods on one GPU have work, each gets GPU time in
 * proportion to its share (`compute` in the pod's directory: millis of a GPU and a mode);
 * a pod alone, or beside idle neighbours, may use the whole GPU unless its mode is `cap`.
 *
 * Measuring. Without MPS a GPU runs one context at a time, time-sliced between the
 * contexts with work. Each process records an event behind each launch on its stream
 * (one event per stream, recorded again at every launch); a thread of its own (the meter)
 * polls them every TICK while any is pending. The process is busy while one is; over a
 * tick in which k processes of the GPU are busy, a busy one is charged tick/k of GPU
 * time. The charge decays with time constant TAU, so what a slot holds is its GPU time
 * over about the last TAU (a pod that ran alone for an hour has no credit to spend).
 *
 * Coordinating. The pods of one GPU share a file the node agent provides (`gpu-time`,
 * the same file in each of their directories): a slot per process, claimed for life with
 * an open-file-description lock like the budget's, holding its pod, share, state (busy,
 * waiting) and decayed GPU time with the time it was last written. A slot not written
 * for STALE (its process died, was stopped, or went idle) counts for nothing.
 *
 * Pacing. Before a launch, a process of pod P (share w) compares P's GPU time per milli
 * with that of every other pod that is busy or waiting. While P is ahead of the least by
 * more than SLACK, the launch waits (TICK at a time, the process marked waiting); it goes
 * as soon as P is no longer ahead, no other pod has work, or it has waited MAX_WAIT (a
 * launch is delayed, never dropped, reordered or held forever). The pod furthest behind
 * never waits, so some pod always runs. In `cap` mode a launch also waits while P's
 * decayed time is above its share of TAU, whatever the others do.
 *
 * Pass-through: no `compute` file or mode `off`, no usable `gpu-time`, or (mode `share`)
 * no other pod with work on the GPU in the last PRESENT: then a launch is the driver's
 * call plus a clock read, and nothing is recorded or timed.
 *
 * Covered: cuLaunchKernel, cuLaunchKernelEx, cuLaunchCooperativeKernel (and their
 * per-thread-stream variants) and cuGraphLaunch (graphs.c calls compute_before/after),
 * however the application found them; the CUDA runtime's launches go through these.
 * Not covered: copies and memsets (copy engines), the pre-4.0 cuLaunch/cuLaunchGrid,
 * launches into a stream being captured (they run when the graph is launched), and work
 * already queued when a pod falls behind (a pod overruns by what it queued).
 */
#include "shim.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MAGIC "GPUPACKC"
#define SLOTS 128
#define HEADER_BYTES 64
#define FILE_BYTES (HEADER_BYTES + SLOTS * 64)
#define MS 1000000ULL
#define TICK_NS (500 * 1000ULL)  /* the meter's period while busy; a wait's step */
#define TAU_NS (1000 * MS)       /* the decay's time constant */
#define STALE_NS (100 * MS)      /* a slot not written since: nothing */
#define PRESENT_NS (1000 * MS)   /* a pod that launched within: a neighbour */
#define RECHECK_NS (10 * MS)     /* how often a process alone looks for neighbours */
#define MAX_WAIT_NS (100 * MS)   /* the longest one launch waits */
#define SLACK 0.02               /* how far ahead (fraction) a pod may run */
#define EVENTS 64                /* streams metered per process */
#define BUSY 1u
#define WAITING 2u

struct gpu_slot {
  uint32_t state, weight;
  uint64_t pod;
  uint64_t gpu_ns;   /* decayed GPU time, as of `stamp` */
  uint64_t stamp;    /* CLOCK_MONOTONIC ns */
  uint32_t mode;
  int32_t pid;
  uint64_t total_ns; /* GPU time ever, not decayed */
  unsigned char pad[16];
};
_Static_assert(sizeof(struct gpu_slot) == 64, "slot layout");
enum { MODE_OFF = 0, MODE_SHARE = 1, MODE_CAP = 2 };

static struct {
  pthread_mutex_t mu; /* the events, the meter's start */
  pthread_cond_t wake;
  int state;          /* UNCONFIGURED, READY */
  int mode;
  uint32_t weight;
  uint64_t pod;
  int fd;
  unsigned char *map;
  int slot;
  uint64_t checked, neighbours, heartbeat;
  uint64_t busy_since; /* when the last launch found nothing pending: the meter counts from it */
  uint64_t own_ns, own_stamp; /* this process's decayed GPU time: its own, whatever the file says */
  uint64_t claimed;           /* when it took its slot: the window its time is a share of */
  int meter_started;
  unsigned said_waits;
  struct {
    CUstream stream;
    CUcontext ctx;
    void *event;
    int pending;
  } events[EVENTS];
} c = {.mu = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER, .fd = -1, .slot = -1};

static uint64_t now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint64_t)t.tv_sec * 1000000000ULL + (uint64_t)t.tv_nsec;
}

static struct gpu_slot *slot_at(int i) {
  return (struct gpu_slot *)(c.map + HEADER_BYTES) + i;
}
#define LOAD(field) __atomic_load_n(&(field), __ATOMIC_ACQUIRE)
#define STORE(field, value) __atomic_store_n(&(field), (value), __ATOMIC_RELEASE)

/* e^-x for x >= 0 without libm: halved until small, a Taylor step, squared back. */
static double decay_factor(double x) {
  if (x > 40) return 0;
  int halvings = 0;
  while (x > 0.25) x /= 2, halvings++;
  double f = 1 - x + x * x / 2 - x * x * x / 6 + x * x * x * x / 24;
  while (halvings--) f *= f;
  return f;
}

static uint64_t decayed(uint64_t ns, uint64_t age) {
  if (!ns || !age) return ns;
  return (uint64_t)((double)ns * decay_factor((double)age / (double)TAU_NS));
}

/* ---- configuration: the pod's `compute` file, the GPU's `gpu-time` ---- */
static int read_compute(const char *dir, uint32_t *weight) {
  char path[300], text[64], word[16] = "";
  snprintf(path, sizeof path, "%s/compute", dir);
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return MODE_OFF;
  ssize_t n = read(fd, text, sizeof text - 1);
  close(fd);
  if (n <= 0) return MODE_OFF;
  text[n] = 0;
  unsigned millis = 0;
  if (sscanf(text, "%u %15s", &millis, word) != 2 || millis < 1 || millis > 1000) {
    say("ignoring %s: not \"MILLIS share|cap|off\" with 1 <= MILLIS <= 1000", path);
    return MODE_OFF;
  }
  *weight = millis;
  if (strcmp(word, "share") == 0) return MODE_SHARE;
  if (strcmp(word, "cap") == 0) return MODE_CAP;
  if (strcmp(word, "off") != 0) say("ignoring %s: mode %s is not share, cap or off", path, word);
  return MODE_OFF;
}

static int claim_slot(void) {
  struct header { char magic[8]; uint32_t slots, high; } *h = (struct header *)c.map;
  char zero[8] = {0};
  if (memcmp(h->magic, zero, 8) == 0) memcpy(h->magic, MAGIC, 8), STORE(h->slots, SLOTS);
  if (memcmp(h->magic, MAGIC, 8) != 0) return -1;
  for (int i = 0; i < SLOTS; i++) {
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET,
                       .l_start = HEADER_BYTES + (off_t)i * 64, .l_len = 64};
    if (fcntl(c.fd, F_OFD_SETLK, &fl) < 0) continue; /* a live process's */
    struct gpu_slot *s = slot_at(i);
    STORE(s->stamp, 0);
    STORE(s->state, 0);
    STORE(s->gpu_ns, 0);
    STORE(s->total_ns, 0);
    STORE(s->pod, c.pod);
    STORE(s->weight, c.weight);
    STORE(s->mode, (uint32_t)c.mode);
    STORE(s->pid, (int32_t)getpid());
    uint32_t high = LOAD(h->high);
    while (high < (uint32_t)i + 1 &&
           !__atomic_compare_exchange_n(&h->high, &high, (uint32_t)i + 1, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
    }
    return i;
  }
  return -1;
}

static void configure_locked(void) {
  const char *dir = shim_getenv("GPUPACK_CUDA_DIR");
  char path[300];
  if (!dir || !*dir) dir = "/run/gpupack/cuda";
  c.mode = read_compute(dir, &c.weight);
  if (c.mode == MODE_OFF) return;
  struct stat st;
  if (stat(dir, &st) == 0) c.pod = ((uint64_t)st.st_dev << 40) ^ (uint64_t)st.st_ino;
  snprintf(path, sizeof path, "%s/gpu-time", dir);
  c.fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  void *map = MAP_FAILED;
  if (c.fd >= 0 && fstat(c.fd, &st) == 0 && st.st_size >= FILE_BYTES)
    map = mmap(NULL, FILE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, c.fd, 0);
  if (map != MAP_FAILED) c.map = map, c.slot = claim_slot(), c.claimed = now_ns();
  if (c.slot < 0) {
    say("compute share not applied: %s is missing, not %d bytes, or has no free slot", path,
        FILE_BYTES);
    c.mode = MODE_OFF;
    return;
  }
  if (!shim.quiet)
    say("GPU compute share %um (%s) for this pod, %s slot %d", c.weight,
        c.mode == MODE_CAP ? "cap" : "share", path, c.slot);
}

static int mode(void) {
  if (__atomic_load_n(&c.state, __ATOMIC_ACQUIRE) == READY) return c.mode;
  pthread_mutex_lock(&c.mu);
  if (__atomic_load_n(&c.state, __ATOMIC_RELAXED) != READY) {
    configure_locked();
    __atomic_store_n(&c.state, READY, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock(&c.mu);
  return c.mode;
}

/* ---- reading the GPU's slots ---- */
static int fresh(const struct gpu_slot *s, uint64_t now, uint64_t within) {
  uint64_t stamp = LOAD(s->stamp);
  return stamp && now >= stamp ? now - stamp < within : stamp > 0;
}

/* Other pods that launched within PRESENT: whether pacing has anyone to share with. */
static uint64_t count_neighbours(uint64_t now) {
  uint32_t high = LOAD(((uint32_t *)c.map)[3]);
  for (uint32_t i = 0; i < high && i < SLOTS; i++) {
    struct gpu_slot *s = slot_at((int)i);
    if ((int)i != c.slot && LOAD(s->pod) != c.pod && LOAD(s->weight) && fresh(s, now, PRESENT_NS))
      return 1;
  }
  return 0;
}

static int busy_processes(uint64_t now) {
  int k = 0;
  uint32_t high = LOAD(((uint32_t *)c.map)[3]);
  for (uint32_t i = 0; i < high && i < SLOTS; i++) {
    struct gpu_slot *s = slot_at((int)i);
    if ((LOAD(s->state) & BUSY) && fresh(s, now, STALE_NS)) k++;
  }
  return k;
}

/* A slot's decayed GPU time now. Another pod can write the file, so what it holds is
 * clamped to what one GPU can give over the decay (TAU); this process's own comes from
 * its memory. */
static uint64_t time_of(int i, uint64_t now) {
  if (i == c.slot) {
    uint64_t stamp = LOAD(c.own_stamp);
    return decayed(LOAD(c.own_ns), now > stamp ? now - stamp : 0);
  }
  struct gpu_slot *s = slot_at(i);
  uint64_t stamp = LOAD(s->stamp), ns = LOAD(s->gpu_ns);
  ns = decayed(ns < TAU_NS ? ns : TAU_NS, now > stamp ? now - stamp : 0);
  return ns;
}

/* GPU time per milli of this pod (`mine`, and in ns), and the least of the other pods
 * with work (-1: none). */
static void standings(uint64_t now, double *mine, double *least, uint64_t *mine_ns) {
  struct { uint64_t pod; double ns; uint32_t weight; } pods[SLOTS];
  int n = 0;
  uint64_t own = 0;
  uint32_t high = LOAD(((uint32_t *)c.map)[3]);
  for (uint32_t i = 0; i < high && i < SLOTS; i++) {
    struct gpu_slot *s = slot_at((int)i);
    uint64_t stamp = LOAD(s->stamp), pod = LOAD(s->pod);
    uint32_t weight = LOAD(s->weight), state = LOAD(s->state);
    if ((int)i != c.slot && (!stamp || !weight || weight > 1000)) continue;
    uint64_t age = now > stamp ? now - stamp : 0;
    if ((int)i == c.slot || pod == c.pod) {
      if ((int)i == c.slot || age < 10 * TAU_NS) own += time_of((int)i, now);
      continue;
    }
    if (!(state & (BUSY | WAITING)) || age >= STALE_NS) continue;
    int j = 0;
    while (j < n && pods[j].pod != pod) j++;
    if (j == n) pods[n++] = (typeof(pods[0])){pod, 0, weight};
    pods[j].ns += (double)time_of((int)i, now);
  }
  *mine_ns = own;
  *mine = (double)own / c.weight;
  *least = -1;
  for (int j = 0; j < n; j++) {
    double v = pods[j].ns / pods[j].weight;
    if (*least < 0 || v < *least) *least = v;
  }
}

/* ---- the meter ---- */
static int query_events(void) {
  typedef CUresult (*query_t)(void *);
  typedef CUresult (*set_t)(CUcontext);
  query_t query = DRIVER(query_t, "cuEventQuery");
  set_t set = DRIVER(set_t, "cuCtxSetCurrent");
  static CUcontext current; /* the meter's own: it is the one thread that queries */
  int pending = 0;
  pthread_mutex_lock(&c.mu);
  for (int i = 0; i < EVENTS; i++) {
    if (!c.events[i].pending) continue;
    if (set && c.events[i].ctx != current && set(c.events[i].ctx) == CUDA_SUCCESS)
      current = c.events[i].ctx;
    CUresult rc = query ? query(c.events[i].event) : CUDA_SUCCESS;
    c.events[i].pending = rc == 600; /* CUDA_ERROR_NOT_READY; anything else: done or gone */
    pending |= c.events[i].pending;
  }
  pthread_mutex_unlock(&c.mu);
  return pending;
}

static void *meter(void *unused) {
  (void)unused;
  struct gpu_slot *s = slot_at(c.slot);
  uint64_t last = now_ns();
  int was_busy = 0;
  for (;;) {
    pthread_mutex_lock(&c.mu);
    int idle = 1;
    for (int i = 0; i < EVENTS && idle; i++) idle = !c.events[i].pending;
    if (idle && !(LOAD(s->state) & WAITING)) {
      STORE(s->state, LOAD(s->state) & ~BUSY);
      pthread_cond_wait(&c.wake, &c.mu);
      last = now_ns(), was_busy = 0;
    }
    pthread_mutex_unlock(&c.mu);
    struct timespec tick = {0, (long)TICK_NS};
    nanosleep(&tick, NULL);
    int busy = query_events();
    uint64_t now = now_ns();
    pthread_mutex_lock(&c.mu);
    uint64_t since = c.busy_since; /* the launch that ended an idle spell */
    c.busy_since = 0;
    pthread_mutex_unlock(&c.mu);
    /* Busy since the last tick, or (idle then) since that launch, not since this thread
     * woke up: a wake-up's delay is never the pod's to keep. */
    uint64_t from = was_busy ? last : since ? (since > last ? since : last) : now;
    last = now, was_busy = busy;
    uint32_t state = LOAD(s->state);
    STORE(s->state, busy ? state | BUSY : state & ~BUSY);
    uint64_t share = 0;
    if (busy || since) {
      int k = busy_processes(now);
      share = (now > from ? now - from : 0) / (uint64_t)(k > 0 ? k : 1);
    }
    uint64_t stamp = LOAD(c.own_stamp);
    uint64_t ns = decayed(LOAD(c.own_ns), stamp && now > stamp ? now - stamp : 0) + share;
    STORE(c.own_ns, ns);
    STORE(c.own_stamp, now);
    STORE(s->gpu_ns, ns);
    STORE(s->total_ns, LOAD(s->total_ns) + share);
    STORE(s->stamp, now);
  }
  return NULL;
}

static void start_meter_locked(void) {
  if (__atomic_load_n(&c.meter_started, __ATOMIC_ACQUIRE)) return;
  pthread_t thread;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int started = pthread_create(&thread, &attr, meter, NULL) == 0;
  pthread_attr_destroy(&attr);
  __atomic_store_n(&c.meter_started, started ? 1 : -1, __ATOMIC_RELEASE); /* -1: tried */
  if (!started) say("compute share not metered: no thread for it");
}

/* ---- around a launch ---- */
static int engaged(uint64_t now) {
  struct gpu_slot *s = slot_at(c.slot);
  /* Times read here may be later than `now` (another thread wrote them since): never
   * subtract them unguarded, or an age wraps and decays the pod's time to nothing. */
  uint64_t beat = LOAD(c.heartbeat);
  if (now > beat + MS) {
    STORE(c.heartbeat, now);
    uint64_t stamp = LOAD(c.own_stamp);
    if (!(LOAD(s->state) & (BUSY | WAITING)) && now > stamp) { /* else the meter keeps it */
      uint64_t ns = decayed(LOAD(c.own_ns), now - stamp);
      STORE(c.own_ns, ns);
      STORE(c.own_stamp, now);
      STORE(s->gpu_ns, ns);
      STORE(s->stamp, now);
    }
  }
  if (c.mode == MODE_CAP) return 1;
  if (now > LOAD(c.checked) + RECHECK_NS) {
    STORE(c.neighbours, count_neighbours(now));
    STORE(c.checked, now);
  }
  return LOAD(c.neighbours) != 0;
}

static int ahead(uint64_t now) {
  double mine, least;
  uint64_t mine_ns;
  standings(now, &mine, &least, &mine_ns);
  /* What the pod's time is a share of: the decayed window since this process came. */
  double window = (double)TAU_NS * (1 - decay_factor((double)(now - c.claimed) / TAU_NS));
  double entitled = window * c.weight / 1000.0;
  if (c.mode == MODE_CAP) return (double)mine_ns > entitled;
  if (least < 0) return 0;                       /* nobody else has work */
  if ((double)mine_ns < entitled) return 0;      /* below its share: never held back */
  return mine > least * (1 + SLACK) + (double)MS / 1000.0;
}

int compute_before(void) {
  if (mode() == MODE_OFF) return 0;
  uint64_t now = now_ns();
  if (!engaged(now)) return 0;
  if (!__atomic_load_n(&c.meter_started, __ATOMIC_ACQUIRE)) {
    pthread_mutex_lock(&c.mu);
    start_meter_locked();
    pthread_mutex_unlock(&c.mu);
  }
  struct gpu_slot *s = slot_at(c.slot);
  uint64_t start = now;
  while (ahead(now)) {
    if (now >= start + MAX_WAIT_NS) {
      if (__atomic_fetch_add(&c.said_waits, 1, __ATOMIC_RELAXED) < 5) say("a launch waited %llu ms for its compute share; it goes now",
                                  (unsigned long long)(MAX_WAIT_NS / MS));
      break;
    }
    if (!(LOAD(s->state) & WAITING)) {
      __atomic_fetch_or(&s->state, WAITING, __ATOMIC_ACQ_REL);
      pthread_mutex_lock(&c.mu);
      pthread_cond_signal(&c.wake); /* the meter keeps our time decaying while we wait */
      pthread_mutex_unlock(&c.mu);
    }
    struct timespec tick = {0, (long)TICK_NS};
    nanosleep(&tick, NULL);
    now = now_ns();
  }
  __atomic_fetch_and(&s->state, ~WAITING, __ATOMIC_ACQ_REL);
  return 1;
}

void compute_after(int engaged_, CUstream stream, int ok) {
  if (!engaged_ || !ok || capturing(stream)) return;
  typedef CUresult (*create_t)(void **, unsigned);
  typedef CUresult (*record_t)(void *, CUstream);
  typedef CUresult (*current_t)(CUcontext *);
  create_t create = DRIVER(create_t, "cuEventCreate");
  record_t record = DRIVER(record_t, "cuEventRecord");
  current_t current = DRIVER(current_t, "cuCtxGetCurrent");
  CUcontext ctx = NULL;
  if (!create || !record || !current || current(&ctx) != CUDA_SUCCESS) return;
  pthread_mutex_lock(&c.mu);
  int at = -1, spare = -1;
  for (int i = 0; i < EVENTS && at < 0; i++) {
    if (c.events[i].event && c.events[i].stream == stream && c.events[i].ctx == ctx) at = i;
    else if (spare < 0 && (!c.events[i].event || !c.events[i].pending)) spare = i;
  }
  if (at < 0 && spare >= 0) {
    at = spare;
    if (c.events[at].event && c.events[at].ctx != ctx) {
      typedef CUresult (*destroy_t)(void *);
      destroy_t destroy = DRIVER(destroy_t, "cuEventDestroy_v2");
      if (destroy) destroy(c.events[at].event);
      c.events[at].event = NULL;
    }
    if (!c.events[at].event && create(&c.events[at].event, 2 /* DISABLE_TIMING */) != 0)
      c.events[at].event = NULL;
    c.events[at].stream = stream, c.events[at].ctx = ctx;
  }
  int was_idle = 1;
  for (int i = 0; i < EVENTS && was_idle; i++) was_idle = !c.events[i].pending;
  if (at >= 0 && c.events[at].event && record(c.events[at].event, stream) == CUDA_SUCCESS) {
    if (was_idle) c.busy_since = now_ns();
    c.events[at].pending = 1;
    __atomic_fetch_or(&slot_at(c.slot)->state, BUSY, __ATOMIC_ACQ_REL);
    pthread_cond_signal(&c.wake);
  }
  pthread_mutex_unlock(&c.mu);
}

/* A fork child: no slot (the parent's lock is the parent's), no events, no meter. */
void compute_reset(void) {
  c.mu = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
  c.wake = (pthread_cond_t)PTHREAD_COND_INITIALIZER;
  if (c.map) munmap(c.map, FILE_BYTES);
  if (c.fd >= 0) close(c.fd);
  c.map = NULL, c.fd = -1, c.slot = -1, c.mode = MODE_OFF, c.meter_started = 0;
  c.checked = c.neighbours = c.heartbeat = c.busy_since = c.own_ns = c.own_stamp = 0;
  memset(c.events, 0, sizeof c.events);
  __atomic_store_n(&c.state, UNCONFIGURED, __ATOMIC_RELEASE);
}

/* ---- the launches ---- */
#define CU_STREAM_PER_THREAD ((CUstream)0x2)
static CUstream per_thread(CUstream stream) { return stream ? stream : CU_STREAM_PER_THREAD; }

typedef CUresult (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void **, void **);
typedef CUresult (*cooperative_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned,
                                  unsigned, unsigned, CUstream, void **);
typedef struct {
  unsigned grid[3], block[3], shared;
  CUstream stream;
  void *attrs;
  unsigned count;
} CUlaunchConfig;
typedef CUresult (*launch_ex_t)(const CUlaunchConfig *, void *, void **, void **);

#define PACED(name, type, stream, call)          \
  type fn = REAL(name, type);                    \
  if (!fn) return CUDA_ERROR_NOT_FOUND;          \
  int paced = compute_before();                  \
  CUresult rc = call;                            \
  compute_after(paced, stream, rc == CUDA_SUCCESS); \
  return rc;

EXPORT CUresult cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               unsigned by, unsigned bz, unsigned shared, CUstream stream,
                               void **params, void **extra) {
  PACED(cuLaunchKernel, launch_t, stream,
        fn(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra))
}
EXPORT CUresult cuLaunchKernel_ptsz(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                    unsigned by, unsigned bz, unsigned shared, CUstream stream,
                                    void **params, void **extra) {
  PACED(cuLaunchKernel_ptsz, launch_t, per_thread(stream),
        fn(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra))
}
EXPORT CUresult cuLaunchCooperativeKernel(void *f, unsigned gx, unsigned gy, unsigned gz,
                                          unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                          CUstream stream, void **params) {
  PACED(cuLaunchCooperativeKernel, cooperative_t, stream,
        fn(f, gx, gy, gz, bx, by, bz, shared, stream, params))
}
EXPORT CUresult cuLaunchCooperativeKernel_ptsz(void *f, unsigned gx, unsigned gy, unsigned gz,
                                               unsigned bx, unsigned by, unsigned bz,
                                               unsigned shared, CUstream stream, void **params) {
  PACED(cuLaunchCooperativeKernel_ptsz, cooperative_t, per_thread(stream),
        fn(f, gx, gy, gz, bx, by, bz, shared, stream, params))
}
EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, void *f, void **params,
                                 void **extra) {
  PACED(cuLaunchKernelEx, launch_ex_t, config ? config->stream : NULL,
        fn(config, f, params, extra))
}
EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, void *f, void **params,
                                      void **extra) {
  PACED(cuLaunchKernelEx_ptsz, launch_ex_t, per_thread(config ? config->stream : NULL),
        fn(config, f, params, extra))
}
