/*
 * The per-process tables: what each allocation, handle, mapping, module or graph took, so
 * that what gives it back gives back exactly that. Open addressing with linear probing
 * and backward-shift deletion: no tombstones, so a table's size follows what is live
 * (13 million alloc/free pairs leave it as small as they found it), and it shrinks when
 * three quarters of it empty. Storage is mmap'd, apart from the application's malloc.
 *
 * A table never fails open: an entry is given room (table_reserve) before the driver
 * is called, and an allocation that cannot have room is refused before it is made, never
 * made and then forgotten (a charge nobody would give back). Callers hold shim.mu.
 */
#include "shim.h"
#include <string.h>
#include <sys/mman.h>


#define FIRST_CAP 256

static struct {
  size_t pending; /* reservations not yet used, across every table: a bound, not exact */
} r;

static uint64_t mix(uint64_t key) {
  key ^= key >> 33;
  key *= 0xff51afd7ed558ccdULL;
  key ^= key >> 33;
  return key;
}

static int resize(struct table *t, size_t cap) {
  size_t bytes = cap * 3 * sizeof(uint64_t);
  void *region = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (region == MAP_FAILED) return 0;
  uint64_t *keys = region, *a = keys + cap, *b = a + cap;
  for (size_t i = 0; i < t->cap; i++) {
    if (!t->keys[i]) continue;
    size_t j = mix(t->keys[i]) & (cap - 1);
    while (keys[j]) j = (j + 1) & (cap - 1);
    keys[j] = t->keys[i], a[j] = t->a[i], b[j] = t->b[i];
  }
  size_t count = t->count;
  table_release(t);
  t->keys = keys, t->a = a, t->b = b, t->cap = cap, t->count = count;
  return 1;
}

int table_reserve(struct table *t) {
  size_t want = t->count + r.pending + 1;
  if (want * 10 > t->cap * 7) {
    size_t cap = t->cap ? t->cap : FIRST_CAP;
    while (want * 10 > cap * 7) cap *= 2;
    if (!resize(t, cap) && want >= t->cap) return 0; /* no room at all */
  }
  r.pending++;
  return 1;
}

static void used_reservation(void) {
  if (r.pending) r.pending--;
}

static size_t find(const struct table *t, uint64_t key, int *found) {
  size_t j = mix(key) & (t->cap - 1);
  while (t->keys[j] && t->keys[j] != key) j = (j + 1) & (t->cap - 1);
  *found = t->keys[j] == key;
  return j;
}

int table_put(struct table *t, uint64_t key, uint64_t a, uint64_t b, uint64_t *old_a,
              uint64_t *old_b) {
  used_reservation();
  if (!key) return 0;
  if (t->count + 1 >= t->cap && !resize(t, t->cap ? t->cap * 2 : FIRST_CAP)) return 0;
  int found;
  size_t j = find(t, key, &found);
  if (found) {
    if (old_a) *old_a = t->a[j];
    if (old_b) *old_b = t->b[j];
  } else {
    t->keys[j] = key;
    t->count++;
  }
  t->a[j] = a, t->b[j] = b;
  return found;
}

void table_unreserve(void) { used_reservation(); }

int table_get(const struct table *t, uint64_t key, uint64_t *a, uint64_t *b) {
  if (!key || !t->cap) return 0;
  int found;
  size_t j = find(t, key, &found);
  if (found) {
    if (a) *a = t->a[j];
    if (b) *b = t->b[j];
  }
  return found;
}

int table_take(struct table *t, uint64_t key, uint64_t *a, uint64_t *b) {
  if (!key || !t->cap) return 0;
  int found;
  size_t i = find(t, key, &found);
  if (!found) return 0;
  if (a) *a = t->a[i];
  if (b) *b = t->b[i];
  size_t mask = t->cap - 1, j = i;
  for (;;) { /* shift back what probed past the emptied slot */
    j = (j + 1) & mask;
    if (!t->keys[j]) break;
    size_t home = mix(t->keys[j]) & mask;
    int stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
    if (stays) continue;
    t->keys[i] = t->keys[j], t->a[i] = t->a[j], t->b[i] = t->b[j];
    i = j;
  }
  t->keys[i] = 0;
  t->count--;
  if (t->cap > FIRST_CAP && t->count * 8 < t->cap) resize(t, t->cap / 2); /* best effort */
  return 1;
}

void table_release(struct table *t) {
  if (t->keys) munmap(t->keys, t->cap * 3 * sizeof(uint64_t));
  t->keys = t->a = t->b = NULL;
  t->cap = 0;
  t->count = 0;
}
