/* Runs one kernel of a TVM object file (built for another CPU) on tensors read from a file.
 *
 * Linked statically with the object by tvm_lowprec.qemu and run under qemu-user. The kernel is the
 * TVM-FFI packed function LOWPREC_ENTRY (its symbol, given with -D at link time) taking DLTensor
 * pointers; the object's backend hooks (workspace, parallel launch) point to the serial versions
 * below, and an error it raises is printed and makes the exit status 2.
 *
 * File format (little endian), input and output alike:
 *   "LPRK" magic, int32 count, then per tensor: uint8 dtype code, uint8 bits, uint16 lanes,
 *   int32 ndim, int64 shape[ndim], int64 nbytes, the bytes.
 * The output file holds every tensor after the call, in the same format.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dlpack/dlpack.h>
#include <tvm/ffi/c_api.h>

typedef struct {
  void* sync_handle;
  int32_t num_task;
} ParallelEnv;
typedef int (*ParallelLambda)(int task_id, ParallelEnv* env, void* cdata);

/* the object's hooks: function-pointer variables that a TVM loader fills in, defined by the object
 * only where a kernel uses them (weak here: a kernel without a parallel loop has no launch hook) */
extern int (*__TVMBackendParallelLaunch)(ParallelLambda, void*, int) __attribute__((weak));
extern void* (*__TVMBackendAllocWorkspace)(int, int, uint64_t, int, int) __attribute__((weak));
extern int (*__TVMBackendFreeWorkspace)(int, int, void*) __attribute__((weak));

int LOWPREC_ENTRY(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result);

static int serial_launch(ParallelLambda lambda, void* cdata, int num_task) {
  (void)num_task;
  ParallelEnv env = {NULL, 1};
  return lambda(0, &env, cdata);
}

static void* alloc_workspace(int device_type, int device_id, uint64_t nbytes, int code, int bits) {
  (void)device_type, (void)device_id, (void)code, (void)bits;
  return aligned_alloc(64, (nbytes + 63) / 64 * 64);
}

static int free_workspace(int device_type, int device_id, void* ptr) {
  (void)device_type, (void)device_id;
  free(ptr);
  return 0;
}

void TVMFFIErrorSetRaisedFromCStrParts(const char* kind, const char** parts, int32_t num_parts) {
  fprintf(stderr, "kernel error: %s: ", kind);
  for (int32_t i = 0; i < num_parts; ++i) fputs(parts[i], stderr);
  fputc('\n', stderr);
}

static void fail(const char* what) {
  fprintf(stderr, "harness: %s\n", what);
  exit(3);
}

static void read_exact(FILE* f, void* dst, size_t n) {
  if (fread(dst, 1, n, f) != n) fail("truncated input file");
}

int main(int argc, char** argv) {
  if (argc != 3) fail("usage: harness IN OUT");
  FILE* in = fopen(argv[1], "rb");
  if (!in) fail("cannot open the input file");
  char magic[4];
  int32_t count;
  read_exact(in, magic, 4);
  if (memcmp(magic, "LPRK", 4)) fail("bad magic");
  read_exact(in, &count, 4);
  DLTensor* tensors = calloc(count, sizeof(DLTensor));
  TVMFFIAny* args = calloc(count, sizeof(TVMFFIAny));
  int64_t* sizes = calloc(count, sizeof(int64_t));
  for (int32_t i = 0; i < count; ++i) {
    DLTensor* t = &tensors[i];
    uint8_t code, bits;
    uint16_t lanes;
    read_exact(in, &code, 1);
    read_exact(in, &bits, 1);
    read_exact(in, &lanes, 2);
    read_exact(in, &t->ndim, 4);
    t->shape = calloc(t->ndim ? t->ndim : 1, sizeof(int64_t));
    read_exact(in, t->shape, sizeof(int64_t) * t->ndim);
    read_exact(in, &sizes[i], 8);
    t->data = aligned_alloc(64, (sizes[i] + 63) / 64 * 64 + 64);
    read_exact(in, t->data, sizes[i]);
    t->device.device_type = kDLCPU;
    t->dtype.code = code;
    t->dtype.bits = bits;
    t->dtype.lanes = lanes;
    args[i].type_index = kTVMFFIDLTensorPtr;
    args[i].v_ptr = t;
  }
  fclose(in);

  if (&__TVMBackendParallelLaunch) __TVMBackendParallelLaunch = serial_launch;
  if (&__TVMBackendAllocWorkspace) __TVMBackendAllocWorkspace = alloc_workspace;
  if (&__TVMBackendFreeWorkspace) __TVMBackendFreeWorkspace = free_workspace;
  TVMFFIAny result;
  memset(&result, 0, sizeof(result));
  if (LOWPREC_ENTRY(NULL, args, count, &result) != 0) return 2;

  FILE* out = fopen(argv[2], "wb");
  if (!out) fail("cannot open the output file");
  fwrite("LPRK", 1, 4, out);
  fwrite(&count, 4, 1, out);
  for (int32_t i = 0; i < count; ++i) {
    DLTensor* t = &tensors[i];
    uint16_t lanes = t->dtype.lanes;
    fwrite(&t->dtype.code, 1, 1, out);
    fwrite(&t->dtype.bits, 1, 1, out);
    fwrite(&lanes, 2, 1, out);
    fwrite(&t->ndim, 4, 1, out);
    fwrite(t->shape, sizeof(int64_t), t->ndim, out);
    fwrite(&sizes[i], 8, 1, out);
    fwrite(t->data, 1, sizes[i], out);
  }
  return fclose(out) == 0 ? 0 : 3;
}
