/* The driver API's structures the fake driver (fake_*.c) and the probe (probe.c) share, as
 * cuda.h lays them out (64-bit). The shim has its own, in cuda-shim/shim.h: it ships alone. */
#ifndef DRIVER_TYPES_H
#define DRIVER_TYPES_H
#include <stddef.h>

typedef unsigned long long CUdeviceptr;
typedef struct { size_t Width, Height; int Format; unsigned NumChannels; } ARRAY;
typedef struct { unsigned Width, Height; int Format; unsigned NumChannels; } ARRAY_V1;
typedef struct { size_t Width, Height, Depth; int Format; unsigned NumChannels, Flags; } ARRAY3D;
typedef struct { unsigned Width, Height, Depth; int Format; unsigned NumChannels, Flags; } ARRAY3D_V1;
typedef struct { int type, id; } LOCATION;
/* CUmemAllocationProp: type, requested handle types, location, then what only the
 * driver reads (win32 metadata, allocation flags). */
typedef struct { int type, requested; LOCATION location; void *meta; unsigned char flags[8]; } PROP;
typedef struct {
  int allocType, handleTypes;
  LOCATION location;
  void *win32;
  size_t maxSize;
  unsigned short usage;
  unsigned char reserved[54];
} POOL_PROPS;
typedef struct {
  POOL_PROPS poolProps;
  const void *accessDescs;
  size_t accessDescCount, bytesize;
  CUdeviceptr dptr;
} ALLOC_PARAMS;
typedef struct {
  unsigned long long flags;
  void *upload_stream, *error_node;
  int result;
} INSTANTIATE_PARAMS;
/* CUlaunchConfig: the grid, the block, shared memory, the stream, then attributes. */
typedef struct {
  unsigned grid[3], block[3], shared;
  void *stream;
  void *attrs;
  unsigned count;
} LAUNCH_CONFIG;
#endif
