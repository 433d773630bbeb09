/*
 * The pod's budget: one file in the pod's directory, shared by all its processes and
 * containers, mapped by each. What every process holds, per device, and nothing else.
 *
 * Layout (little-endian, BUDGET_BYTES; gpupack/cuda.py reads it for the node agent):
 *
 *   0      header, 4096 bytes: magic "GPUPACK2", slots (1024), devices (16), high (one past
 *          the highest slot ever claimed), then at 64 the device table: 16 entries of 32
 *          bytes {u32 state (0 free, 1 being written, 2 set), u8 uuid[16]}
 *   4096   1024 slots of 64 bytes: {u32 live, i32 pid (in its own PID namespace), u64 start
 *          (its start time, clock ticks after boot: /proc/self/stat's 22nd field), u32
 *          devices (a bit per device-table entry it has a context or memory on), u32
 *          refused, u64 peak, u64 held}
 *   69632  used: 16 x 1024 u64, the bytes each slot's process holds on each device
 *
 * A process owns one slot for life by holding an open-file-description lock on the
 * slot's 64 bytes; the kernel drops the lock when the process dies however it dies, so a
 * slot nobody holds is a dead process's and its usage no longer counts (it is zeroed, by
 * whoever finds it so, under that slot's lock). The pid and start time say who is there
 * without reading any process's memory: the node agent matches them with NVML's list of
 * GPU processes to find processes the shim missed.
 *
 * Charging takes no lock. A process adds the bytes to its own counter, then sums every
 * slot's counter for that device; over the limit, it takes them back and is refused.
 * Two processes charging at once each see the other's bytes, so both may be refused but
 * both cannot pass (a refusal caused only by another's charge in flight is retried). So a
 * process stopped at any point (SIGSTOP, a debugger) never stalls the others: what it
 * holds, or is about to take, simply counts.
 *
 * The file is made by the node agent, full size and zeroed; the shim stamps the header.
 * It opens it without following a symbolic link, never changes the mode of a file it did
 * not create, and creates one only outside setuid programs (tests, a hand-made pod
 * directory). A budget it cannot use makes every charge of the process refused and its
 * free memory read zero: a limit that cannot be kept is not run unbounded.
 */
#include "shim.h"
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>


#define MAGIC "GPUPACK2"
#define HEADER_BYTES 4096
#define SLOTS 1024
#define SLOT_BYTES 64
#define DEVICE_TABLE 64
#define USED_OFFSET (HEADER_BYTES + SLOTS * SLOT_BYTES)
#define BUDGET_BYTES (USED_OFFSET + BUDGET_DEVICES * SLOTS * 8)
#define RETRIES 8
#define REFUSALS_SAID 20

struct header {
  char magic[8];
  uint32_t slots, devices, high, unused;
};
struct device_entry {
  uint32_t state;
  unsigned char uuid[16];
  unsigned char pad[12];
};
struct slot {
  uint32_t live;
  int32_t pid;
  uint64_t start;
  uint32_t devices, refused;
  uint64_t peak, held;
  unsigned char pad[24];
};
_Static_assert(sizeof(struct slot) == SLOT_BYTES, "slot layout");
_Static_assert(sizeof(struct device_entry) == 32, "device layout");

static struct {
  int fd;
  unsigned char *map;
  int slot;
  unsigned said; /* refusal lines this process wrote */
  int told_unusable;
  signed char ordinal_index[MAX_ORDINALS]; /* 0: not asked yet; else index + 1, or -1 */
  int device_count;                        /* 0: not known yet */
} b = {.fd = -1, .slot = -1};

static struct header *header(void) { return (struct header *)b.map; }
static struct device_entry *device_entry(int i) {
  return (struct device_entry *)(b.map + DEVICE_TABLE) + i;
}
static struct slot *slot_at(int i) {
  return (struct slot *)(b.map + HEADER_BYTES + (size_t)i * SLOT_BYTES);
}
static uint64_t *used_at(int device, int i) {
  return (uint64_t *)(b.map + USED_OFFSET) + (size_t)device * SLOTS + (size_t)i;
}

static int lock_slot(int cmd, short type, int i) {
  struct flock fl = {.l_type = type,
                     .l_whence = SEEK_SET,
                     .l_start = HEADER_BYTES + (off_t)i * SLOT_BYTES,
                     .l_len = SLOT_BYTES};
  int rc;
  do rc = fcntl(b.fd, cmd, &fl);
  while (rc < 0 && errno == EINTR);
  return rc;
}

/* This process's start time in clock ticks after boot, as /proc/<pid>/stat says on the
 * host too (the same in every PID namespace). 0 when unreadable. */
static uint64_t start_time(void) {
  char text[1024];
  int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, text, sizeof text - 1);
  close(fd);
  if (n <= 0) return 0;
  text[n] = 0;
  char *p = strrchr(text, ')'); /* the command may hold spaces and parentheses */
  if (!p) return 0;
  for (int field = 2; field < 22 && p; field++) p = strchr(p + 1, ' ');
  return p ? strtoull(p + 1, NULL, 10) : 0;
}

static void unusable(const char *path, const char *why) {
  say("cannot use the budget %s: %s; every GPU memory allocation of this process is "
      "refused, since the pod's limit cannot be kept", path, why);
}

static int stamp(void) {
  uint64_t magic, zero = 0;
  memcpy(&magic, MAGIC, 8);
  uint64_t *word = (uint64_t *)b.map;
  if (__atomic_compare_exchange_n(word, &zero, magic, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) ||
      zero == magic) {
    header()->slots = SLOTS, header()->devices = BUDGET_DEVICES; /* the same bytes for all */
    return 1;
  }
  return 0;
}

static int claim(void) {
  for (int i = 0; i < SLOTS; i++) {
    if (lock_slot(F_OFD_SETLK, F_WRLCK, i) != 0) continue;
    for (int d = 0; d < BUDGET_DEVICES; d++) __atomic_store_n(used_at(d, i), 0, __ATOMIC_SEQ_CST);
    struct slot *s = slot_at(i);
    memset(s, 0, sizeof *s); /* a dead process's leftovers */
    s->pid = (int32_t)getpid();
    s->start = start_time();
    __atomic_store_n(&s->live, 1, __ATOMIC_RELEASE);
    uint32_t high = __atomic_load_n(&header()->high, __ATOMIC_ACQUIRE);
    while (high < (uint32_t)i + 1 &&
           !__atomic_compare_exchange_n(&header()->high, &high, (uint32_t)i + 1, 0,
                                        __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
    }
    return i;
  }
  return -1;
}

int budget_open(const char *dir) {
  char path[300];
  snprintf(path, sizeof path, "%s/budget", dir);
  int created = 0;
  b.fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  if (b.fd < 0 && errno == ENOENT && !getauxval(AT_SECURE)) {
    b.fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    created = b.fd >= 0;
    if (b.fd < 0 && errno == EEXIST) b.fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
  }
  if (b.fd < 0) {
    unusable(path, strerror(errno));
    return 0;
  }
  struct stat info;
  const char *why = NULL;
  char text[96];
  if (fstat(b.fd, &info) != 0) {
    why = strerror(errno);
  } else if (!S_ISREG(info.st_mode)) {
    why = "not a regular file";
  } else if (created) {
    /* Every container of the pod, whatever its user: only on a file this process made. */
    if (fchmod(b.fd, 0666) != 0 || ftruncate(b.fd, BUDGET_BYTES) != 0) why = strerror(errno);
  } else if (info.st_size < BUDGET_BYTES) {
    snprintf(text, sizeof text, "it is %lld bytes, not the %d of this shim's layout",
             (long long)info.st_size, BUDGET_BYTES);
    why = text;
  }
  if (!why) {
    void *map = mmap(NULL, BUDGET_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, b.fd, 0);
    if (map == MAP_FAILED) why = strerror(errno);
    else b.map = map;
  }
  if (!why && !stamp()) {
    snprintf(text, sizeof text, "another version of the shim made it (%.8s, not %s)",
             (const char *)b.map, MAGIC);
    why = text;
  }
  if (!why && (b.slot = claim()) < 0) {
    snprintf(text, sizeof text, "all %d slots are taken by live processes", SLOTS);
    why = text;
  }
  if (!why) return 1;
  unusable(path, why);
  budget_drop();
  return 0;
}

void budget_drop(void) {
  if (b.map) munmap(b.map, BUDGET_BYTES);
  if (b.fd >= 0) close(b.fd);
  b.map = NULL, b.fd = -1, b.slot = -1, b.said = 0, b.device_count = 0;
  memset(b.ordinal_index, 0, sizeof b.ordinal_index);
}

int budget_usable(void) { return b.slot >= 0; }
int budget_slot(void) { return b.slot; }

/* ---- devices: the budget tells them apart by UUID, whatever each process calls them ---- */
int device_index_by_uuid(const unsigned char uuid[16]) {
  if (!b.map) return -1;
  for (int pass = 0; pass < 2; pass++) {
    for (int j = 0; j < BUDGET_DEVICES; j++) {
      struct device_entry *e = device_entry(j);
      uint32_t state = __atomic_load_n(&e->state, __ATOMIC_ACQUIRE);
      if (state == 0 && pass == 1) {
        uint32_t expected = 0;
        if (__atomic_compare_exchange_n(&e->state, &expected, 1, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
          memcpy(e->uuid, uuid, 16);
          __atomic_store_n(&e->state, 2, __ATOMIC_RELEASE);
          return j;
        }
        state = expected;
      }
      /* Another process is writing this entry: it takes a moment (or it died doing so:
       * then the entry stays unusable, and the next one serves). */
      for (int spin = 0; state == 1 && spin < 1000; spin++) {
        sched_yield();
        state = __atomic_load_n(&e->state, __ATOMIC_ACQUIRE);
      }
      if (state == 2 && memcmp(e->uuid, uuid, 16) == 0) return j;
      if (state == 0 && pass == 0) break; /* entries fill in order: not there */
    }
  }
  return -1;
}

int device_index(CUdevice ordinal) {
  if (ordinal < 0 || ordinal >= MAX_ORDINALS || !b.map) return -1;
  int cached = __atomic_load_n(&b.ordinal_index[ordinal], __ATOMIC_RELAXED);
  if (cached) return cached > 0 ? cached - 1 : -1;
  typedef CUresult (*uuid_fn)(CUuuid *, CUdevice);
  uuid_fn get = (uuid_fn)driver_symbol("cuDeviceGetUuid_v2");
  if (!get) get = (uuid_fn)driver_symbol("cuDeviceGetUuid");
  CUuuid id;
  int index = -1;
  if (get && get(&id, ordinal) == CUDA_SUCCESS) {
    index = device_index_by_uuid(id.bytes);
  } else if (ordinal < BUDGET_DEVICES) { /* no UUID to be had: the ordinal itself */
    unsigned char made_up[16] = {0};
    memcpy(made_up, "ordinal", 7);
    made_up[15] = (unsigned char)ordinal;
    index = device_index_by_uuid(made_up);
  }
  __atomic_store_n(&b.ordinal_index[ordinal], (signed char)(index >= 0 ? index + 1 : -1),
                   __ATOMIC_RELAXED);
  return index;
}

int current_ordinal(void) {
  int count = __atomic_load_n(&b.device_count, __ATOMIC_RELAXED);
  if (!count) {
    typedef CUresult (*count_fn)(int *);
    count_fn get = (count_fn)driver_symbol("cuDeviceGetCount");
    int n = 0;
    if (get && get(&n) == CUDA_SUCCESS && n > 0)
      __atomic_store_n(&b.device_count, count = n, __ATOMIC_RELAXED);
  }
  if (count == 1) return 0; /* a pod's share: one GPU, no question to ask */
  typedef CUresult (*dev_fn)(CUdevice *);
  dev_fn get = (dev_fn)driver_symbol("cuCtxGetDevice");
  CUdevice device = 0;
  if (!get || get(&device) != CUDA_SUCCESS) device = 0;
  return device;
}

int current_index(void) { return device_index(current_ordinal()); }

void note_device(int index) {
  if (b.slot < 0 || index < 0) return;
  __atomic_fetch_or(&slot_at(b.slot)->devices, 1u << index, __ATOMIC_RELAXED);
}

/* ---- charging ---- */
static uint64_t sum(int index) {
  uint32_t high = __atomic_load_n(&header()->high, __ATOMIC_ACQUIRE);
  if (high > SLOTS) high = SLOTS;
  uint64_t total = 0;
  for (uint32_t i = 0; i < high; i++) {
    uint64_t used = __atomic_load_n(used_at(index, (int)i), __ATOMIC_SEQ_CST);
    total = total + used < total ? UINT64_MAX : total + used;
  }
  return total;
}

/* Zeroes the slots of dead processes that still show usage; returns how many. A slot we
 * can lock has nobody: its process is gone. */
static int reclaim(void) {
  uint32_t high = __atomic_load_n(&header()->high, __ATOMIC_ACQUIRE);
  int found = 0;
  for (uint32_t i = 0; i < high && i < SLOTS; i++) {
    if ((int)i == b.slot) continue;
    int any = __atomic_load_n(&slot_at((int)i)->live, __ATOMIC_ACQUIRE) != 0;
    for (int d = 0; d < BUDGET_DEVICES && !any; d++)
      any = __atomic_load_n(used_at(d, (int)i), __ATOMIC_RELAXED) != 0;
    if (!any || lock_slot(F_OFD_SETLK, F_WRLCK, (int)i) != 0) continue;
    for (int d = 0; d < BUDGET_DEVICES; d++) __atomic_store_n(used_at(d, (int)i), 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&slot_at((int)i)->live, 0, __ATOMIC_RELEASE);
    lock_slot(F_OFD_SETLK, F_UNLCK, (int)i);
    found++;
  }
  return found;
}

static void refused(uint64_t bytes, uint64_t held, const char *call) {
  if (b.slot >= 0) __atomic_fetch_add(&slot_at(b.slot)->refused, 1, __ATOMIC_RELAXED);
  unsigned said = __atomic_fetch_add(&b.said, 1, __ATOMIC_RELAXED);
  if (said >= REFUSALS_SAID) return;
  char want[32], have[32], limit[32];
  human(want, sizeof want, bytes);
  human(have, sizeof have, held);
  human(limit, sizeof limit, shim.limit);
  const char *more = said + 1 == REFUSALS_SAID ? " (further refusals are not logged)" : "";
  if (b.slot >= 0)
    say("refused %s of %s: the pod's GPU memory limit is %s and its processes hold %s; "
        "raise the pod's gpupack.io/gpu-memory annotation (or its policy's share) for more%s",
        call, want, limit, have, more);
  else
    say("refused %s of %s: the pod's budget in %s cannot be used, so its limit of %s "
        "cannot be kept%s", call, want, shim.dir, limit, more);
}

static void account(int index, int64_t bytes) {
  struct slot *s = slot_at(b.slot);
  uint64_t held = __atomic_add_fetch(&s->held, (uint64_t)bytes, __ATOMIC_RELAXED);
  if (bytes > 0) {
    if (held > __atomic_load_n(&s->peak, __ATOMIC_RELAXED))
      __atomic_store_n(&s->peak, held, __ATOMIC_RELAXED);
    note_device(index);
  }
}

int charge(int index, uint64_t bytes, const char *call, int force) {
  if (b.slot < 0 || index < 0 || index >= BUDGET_DEVICES) {
    if (force) return 1; /* nothing to keep: nothing to charge */
    refused(bytes, 0, call);
    return 0;
  }
  if (!bytes) return 1;
  if (!force && bytes > shim.limit) {
    refused(bytes, sum(index), call);
    return 0;
  }
  uint64_t *own = used_at(index, b.slot);
  for (int attempt = 0;; attempt++) {
    __atomic_fetch_add(own, bytes, __ATOMIC_SEQ_CST);
    if (force) break;
    uint64_t total = sum(index);
    if (total <= shim.limit) break;
    __atomic_fetch_sub(own, bytes, __ATOMIC_SEQ_CST);
    if (attempt < RETRIES) {
      if (reclaim()) continue;
      if (sum(index) <= shim.limit - bytes) { /* only a charge in flight was in the way */
        sched_yield();
        continue;
      }
    }
    refused(bytes, total - bytes, call);
    return 0;
  }
  account(index, (int64_t)bytes);
  return 1;
}

void uncharge(int index, uint64_t bytes) {
  if (b.slot < 0 || index < 0 || index >= BUDGET_DEVICES || !bytes) return;
  uint64_t *own = used_at(index, b.slot);
  uint64_t held = __atomic_load_n(own, __ATOMIC_RELAXED), next;
  do next = held > bytes ? held - bytes : 0;
  while (!__atomic_compare_exchange_n(own, &held, next, 0, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED));
  account(index, -(int64_t)(held - next));
}

uint64_t pod_used(int index) {
  if (b.slot < 0 || index < 0 || index >= BUDGET_DEVICES) return 0;
  reclaim();
  return sum(index);
}

int fits(int index, uint64_t bytes, const char *call) {
  if (b.slot < 0 || index < 0 || index >= BUDGET_DEVICES) {
    refused(bytes, 0, call);
    return 0;
  }
  uint64_t used = sum(index);
  if (bytes <= shim.limit && used > shim.limit - bytes && reclaim()) used = sum(index);
  if (bytes <= shim.limit && used <= shim.limit - bytes) return 1;
  refused(bytes, used, call);
  return 0;
}
