/* The fake driver's graphs (their memory reserved in a per-device graph pool at upload or
 * launch, kept until cuDeviceGraphMemTrim), stream captures, and modules (their globals
 * taken at load: a cubin's .nv.global sections, or "FAKEMOD globals=N" for an image whose
 * size only the driver knows). */
#include "fake_cuda.h"

#include <elf.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { GRAPH_NODE = 4, EMPTY_NODE = 5, ALLOC_NODE = 10, FREE_NODE = 11 };
struct node {
  int type, device;
  uint64_t bytes, dptr;
  struct graph *child;
};
struct graph {
  struct node **nodes;
  int count;
};
struct exec {
  struct graph *graph;
};

static uint64_t next_graph_va = 0x500000000000ULL;
static uint64_t reserved[FAKE_MAX_DEVICES], used[FAKE_MAX_DEVICES];
static struct map graph_pointers; /* an allocation a launch made that outlives it */

static struct node *add(struct graph *g, struct node n) {
  struct node *made = malloc(sizeof *made);
  *made = n;
  pthread_mutex_lock(&fake_mu);
  g->nodes = realloc(g->nodes, (size_t)(g->count + 1) * sizeof *g->nodes);
  g->nodes[g->count++] = made;
  pthread_mutex_unlock(&fake_mu);
  return made;
}

static uint64_t new_graph_address(uint64_t bytes) {
  pthread_mutex_lock(&fake_mu);
  uint64_t at = next_graph_va;
  next_graph_va += (bytes + 4095) / 4096 * 4096 + 4096;
  pthread_mutex_unlock(&fake_mu);
  return at;
}

CUresult cuGraphCreate(void **graph, unsigned flags) {
  CALLED;
  (void)flags;
  *graph = calloc(1, sizeof(struct graph));
  return OK;
}
CUresult cuGraphDestroy(void *graph) { CALLED; (void)graph; return OK; }
CUresult cuGraphAddMemAllocNode(void **node, void *graph, void *deps, size_t n, ALLOC_PARAMS *p) {
  CALLED;
  (void)deps, (void)n;
  if (!p || p->poolProps.location.type != 1) return INVALID;
  p->dptr = new_graph_address(p->bytesize);
  *node = add(graph, (struct node){ALLOC_NODE, p->poolProps.location.id, p->bytesize, p->dptr, NULL});
  return OK;
}
CUresult cuGraphAddMemFreeNode(void **node, void *graph, void *deps, size_t n, CUdeviceptr dptr) {
  CALLED;
  (void)deps, (void)n;
  *node = add(graph, (struct node){FREE_NODE, 0, 0, dptr, NULL});
  return OK;
}
CUresult cuGraphAddEmptyNode(void **node, void *graph, void *deps, size_t n) {
  CALLED;
  (void)deps, (void)n;
  *node = add(graph, (struct node){EMPTY_NODE, 0, 0, 0, NULL});
  return OK;
}
CUresult cuGraphAddChildGraphNode(void **node, void *graph, void *deps, size_t n, void *child) {
  CALLED;
  (void)deps, (void)n;
  *node = add(graph, (struct node){GRAPH_NODE, 0, 0, 0, child});
  return OK;
}
CUresult cuGraphGetNodes(void *graph, void **nodes, size_t *count) {
  CALLED;
  struct graph *g = graph;
  if (nodes)
    for (size_t i = 0; i < *count && i < (size_t)g->count; i++) nodes[i] = g->nodes[i];
  *count = (size_t)g->count;
  return OK;
}
CUresult cuGraphNodeGetType(void *node, int *type) { CALLED; *type = ((struct node *)node)->type; return OK; }
CUresult cuGraphMemAllocNodeGetParams(void *node, ALLOC_PARAMS *p) {
  CALLED;
  struct node *n = node;
  if (n->type != ALLOC_NODE) return INVALID;
  memset(p, 0, sizeof *p);
  p->poolProps.allocType = 1;
  p->poolProps.location.type = 1, p->poolProps.location.id = n->device;
  p->bytesize = n->bytes, p->dptr = n->dptr;
  return OK;
}
CUresult cuGraphChildGraphNodeGetGraph(void *node, void **graph) {
  CALLED;
  struct node *n = node;
  if (n->type != GRAPH_NODE) return INVALID;
  *graph = n->child;
  return OK;
}

/* What running a graph allocates, per device, and what of it the graph frees itself. */
static void plan(struct graph *g, uint64_t need[FAKE_MAX_DEVICES], struct graph *top, int depth) {
  for (int i = 0; i < g->count && depth < 8; i++) {
    struct node *n = g->nodes[i];
    if (n->type == ALLOC_NODE && n->device < FAKE_MAX_DEVICES) need[n->device] += n->bytes;
    if (n->type == GRAPH_NODE) plan(n->child, need, top, depth + 1);
  }
}
static int freed_in(struct graph *g, uint64_t dptr, int depth) {
  for (int i = 0; i < g->count && depth < 8; i++) {
    struct node *n = g->nodes[i];
    if ((n->type == FREE_NODE && n->dptr == dptr) ||
        (n->type == GRAPH_NODE && freed_in(n->child, dptr, depth + 1)))
      return 1;
  }
  return 0;
}
static void outliving(struct graph *g, struct graph *top, int depth) {
  for (int i = 0; i < g->count && depth < 8; i++) {
    struct node *n = g->nodes[i];
    if (n->type == ALLOC_NODE && !freed_in(top, n->dptr, 0) &&
        !map_get(&graph_pointers, n->dptr)) {
      struct node *copy = malloc(sizeof *copy);
      *copy = *n;
      map_put(&graph_pointers, n->dptr, copy);
      used[n->device] += n->bytes;
    }
    if (n->type == GRAPH_NODE) outliving(n->child, top, depth + 1);
  }
}

/* Reserves the graph's memory in each device's graph pool; 0 if a device is full. */
static int reserve_for(struct graph *g) {
  uint64_t need[FAKE_MAX_DEVICES] = {0};
  pthread_mutex_lock(&fake_mu);
  plan(g, need, g, 0);
  pthread_mutex_unlock(&fake_mu);
  for (int d = 0; d < FAKE_MAX_DEVICES; d++) {
    if (!need[d]) continue;
    pthread_mutex_lock(&fake_mu);
    uint64_t want = used[d] + need[d], have = reserved[d];
    pthread_mutex_unlock(&fake_mu);
    if (want > have && !fake_device_take(d, want - have)) return 0;
    pthread_mutex_lock(&fake_mu);
    if (want > reserved[d]) reserved[d] = want;
    pthread_mutex_unlock(&fake_mu);
  }
  return 1;
}

static CUresult instantiate(void **exec, void *graph, unsigned long long flags) {
  if (!graph) return INVALID;
  if (flags & 2 && !reserve_for(graph)) return OOM; /* uploaded at once */
  struct exec *e = malloc(sizeof *e);
  e->graph = graph;
  *exec = e;
  return OK;
}
CUresult cuGraphInstantiate_v2(void **exec, void *graph, void *error_node, char *log, size_t size) {
  CALLED;
  (void)error_node, (void)log, (void)size;
  return instantiate(exec, graph, 0);
}
CUresult cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags) {
  CALLED;
  return instantiate(exec, graph, flags);
}
CUresult cuGraphInstantiateWithParams(void **exec, void *graph, INSTANTIATE_PARAMS *params) {
  CALLED;
  return instantiate(exec, graph, params ? params->flags : 0);
}
CUresult cuGraphExecDestroy(void *exec) { CALLED; free(exec); return OK; }
CUresult cuGraphUpload(void *exec, void *stream) {
  CALLED;
  (void)stream;
  return reserve_for(((struct exec *)exec)->graph) ? OK : OOM;
}
CUresult cuGraphLaunch(void *exec, void *stream) {
  CALLED;
  (void)stream;
  if (!exec) return INVALID; /* a real driver would crash or refuse */
  struct graph *g = ((struct exec *)exec)->graph;
  if (!reserve_for(g) || !launched(current_device())) return OOM;
  pthread_mutex_lock(&fake_mu);
  outliving(g, g, 0);
  pthread_mutex_unlock(&fake_mu);
  fake_clock_launch(current_device() < 0 ? 0 : current_device()); /* one kernel's time */
  return OK;
}
CUresult cuDeviceGraphMemTrim(int device) {
  CALLED;
  pthread_mutex_lock(&fake_mu);
  uint64_t spare = reserved[device] - used[device];
  reserved[device] = used[device];
  pthread_mutex_unlock(&fake_mu);
  fake_device_give(device, spare);
  return OK;
}
CUresult cuDeviceGetGraphMemAttribute(int device, int attr, void *value) {
  CALLED;
  pthread_mutex_lock(&fake_mu);
  *(uint64_t *)value = attr < 2 ? used[device] : reserved[device];
  pthread_mutex_unlock(&fake_mu);
  return OK;
}
int is_graph_memory(CUdeviceptr p) {
  pthread_mutex_lock(&fake_mu);
  int found = map_get(&graph_pointers, p) != NULL;
  pthread_mutex_unlock(&fake_mu);
  return found;
}
void graph_memory_freed(CUdeviceptr p) { /* back to the graph pool, still reserved */
  pthread_mutex_lock(&fake_mu);
  struct node *n = map_take(&graph_pointers, p);
  if (n) used[n->device] -= n->bytes;
  pthread_mutex_unlock(&fake_mu);
  free(n);
}

/* ---- stream capture ---- */
#define CAPTURES 64
static struct { void *stream; struct graph *graph; } captures[CAPTURES];

static struct graph *capturing_into(void *stream) {
  for (int i = 0; i < CAPTURES; i++)
    if (captures[i].graph && captures[i].stream == stream) return captures[i].graph;
  return NULL;
}
static CUresult begin(void *stream, struct graph *into) {
  pthread_mutex_lock(&fake_mu);
  int slot = -1;
  for (int i = 0; i < CAPTURES && slot < 0; i++)
    if (!captures[i].graph) slot = i;
  if (slot >= 0) captures[slot].stream = stream, captures[slot].graph = into ? into : calloc(1, sizeof(struct graph));
  pthread_mutex_unlock(&fake_mu);
  return slot >= 0 ? OK : INVALID;
}
CUresult cuStreamBeginCapture(void *stream) { CALLED; return begin(stream, NULL); }
CUresult cuStreamBeginCapture_v2(void *stream, int mode) { CALLED; (void)mode; return begin(stream, NULL); }
CUresult cuStreamBeginCapture_v2_ptsz(void *stream, int mode) { CALLED; (void)mode; return begin(stream, NULL); }
CUresult cuStreamEndCapture(void *stream, void **graph) {
  CALLED;
  pthread_mutex_lock(&fake_mu);
  *graph = NULL;
  for (int i = 0; i < CAPTURES; i++)
    if (captures[i].graph && captures[i].stream == stream)
      *graph = captures[i].graph, captures[i].graph = NULL;
  pthread_mutex_unlock(&fake_mu);
  return *graph ? OK : INVALID;
}
CUresult cuStreamIsCapturing(void *stream, int *status) {
  CALLED;
  pthread_mutex_lock(&fake_mu);
  *status = capturing_into(stream) != NULL;
  pthread_mutex_unlock(&fake_mu);
  return OK;
}
int capture_allocation(void *stream, CUdeviceptr *p, size_t bytes, int device) {
  pthread_mutex_lock(&fake_mu);
  struct graph *g = capturing_into(stream);
  pthread_mutex_unlock(&fake_mu);
  if (!g) return 0;
  *p = new_graph_address(bytes);
  add(g, (struct node){ALLOC_NODE, device, bytes, *p, NULL});
  return 1;
}
int capture_free(void *stream, CUdeviceptr p) {
  pthread_mutex_lock(&fake_mu);
  struct graph *g = capturing_into(stream);
  pthread_mutex_unlock(&fake_mu);
  if (!g) return 0;
  add(g, (struct node){FREE_NODE, 0, 0, p, NULL});
  return 1;
}

/* ---- modules and libraries: their globals taken at load ---- */
struct module {
  int device;
  uint64_t bytes;
};

static uint64_t globals(const void *image) {
  const Elf64_Ehdr *head = image;
  if (memcmp(head->e_ident, ELFMAG, SELFMAG) == 0) {
    const Elf64_Shdr *sections = (const Elf64_Shdr *)((const char *)image + head->e_shoff);
    const char *names = (const char *)image + sections[head->e_shstrndx].sh_offset;
    uint64_t bytes = 0;
    for (int i = 0; i < head->e_shnum; i++)
      if (strncmp(names + sections[i].sh_name, ".nv.global", 10) == 0) bytes += sections[i].sh_size;
    return bytes;
  }
  const char *text = image;
  return strncmp(text, "FAKEMOD globals=", 16) == 0 ? strtoull(text + 16, NULL, 10) : 0;
}

static CUresult load(void **handle, const void *image) {
  if (!image) return INVALID;
  int device = current_device() >= 0 ? current_device() : 0;
  uint64_t bytes = globals(image);
  if (bytes && !fake_device_take(device, bytes)) return OOM;
  struct module *m = malloc(sizeof *m);
  *m = (struct module){device, bytes};
  *handle = m;
  return OK;
}
static CUresult load_file(void **handle, const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat info;
  if (fd < 0 || fstat(fd, &info) != 0) return NOT_FOUND;
  char *image = calloc(1, (size_t)info.st_size + 1);
  CUresult rc = read(fd, image, (size_t)info.st_size) == info.st_size ? load(handle, image) : INVALID;
  close(fd);
  free(image);
  return rc;
}
static CUresult unload(void *handle) {
  struct module *m = handle;
  if (!m) return INVALID;
  fake_device_give(m->device, m->bytes);
  free(m);
  return OK;
}
CUresult cuModuleLoad(void **m, const char *path) { CALLED; return load_file(m, path); }
CUresult cuModuleLoadData(void **m, const void *image) { CALLED; return load(m, image); }
CUresult cuModuleLoadDataEx(void **m, const void *image, unsigned n, int *o, void **v) {
  CALLED;
  (void)n, (void)o, (void)v;
  return load(m, image);
}
CUresult cuModuleLoadFatBinary(void **m, const void *image) { CALLED; return load(m, image); }
CUresult cuModuleUnload(void *m) { CALLED; return unload(m); }
CUresult cuLibraryLoadData(void **l, const void *code, int *jo, void **jv, unsigned jn, int *lo,
                           void **lv, unsigned ln) {
  CALLED;
  (void)jo, (void)jv, (void)jn, (void)lo, (void)lv, (void)ln;
  return load(l, code);
}
CUresult cuLibraryLoadFromFile(void **l, const char *path, int *jo, void **jv, unsigned jn, int *lo,
                               void **lv, unsigned ln) {
  CALLED;
  (void)jo, (void)jv, (void)jn, (void)lo, (void)lv, (void)ln;
  return load_file(l, path);
}
CUresult cuLibraryUnload(void *l) { CALLED; return unload(l); }
