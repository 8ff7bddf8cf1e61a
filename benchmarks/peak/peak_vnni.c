/* Instruction-throughput ceilings of the VNNI int8 GEMM rows, for "% of peak" on CPUs with VNNI.
 *
 *   gcc -O2 -mavx512f -mavx512vl -mavx512vnni -pthread peak_vnni.c -o peak_vnni && ./peak_vnni [threads] [reps]
 *
 * vpdpbusd zmm: 64 u8 x s8 MACs = 128 ops (row x86-avx512-vnni); vpdpbusd ymm (EVEX): 32 MACs = 64 ops.
 * Inline assembly, 12 independent accumulators (zmm0-11, covering a 4-5 cycle latency on two ports),
 * operands in zmm28-31 that the loop never writes. Dies with SIGILL on a CPU without AVX-512 VNNI.
 * Prints GOPS per thread count, one line per repetition. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define ITERS 20000000L

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define DP(r, acc) "vpdpbusd %%" r "31, %%" r "30, %%" r #acc "\n"
#define TWELVE(r) DP(r, 0) DP(r, 1) DP(r, 2) DP(r, 3) DP(r, 4) DP(r, 5) DP(r, 6) DP(r, 7) DP(r, 8) DP(r, 9) DP(r, 10) DP(r, 11)

static void *dp_zmm(void *arg) {
    (void)arg;
    for (long it = 0; it < ITERS; it++) __asm__ volatile(TWELVE("zmm")::: "memory");
    return NULL;
}

static void *dp_ymm(void *arg) {
    (void)arg;
    for (long it = 0; it < ITERS; it++) __asm__ volatile(TWELVE("ymm")::: "memory");
    return NULL;
}

static double run(void *(*fn)(void *), int threads, double ops_per_iter) {
    pthread_t t[256];
    double t0 = now();
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, fn, NULL);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    return ops_per_iter * ITERS * threads / (now() - t0) / 1e9;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1, reps = argc > 2 ? atoi(argv[2]) : 3;
    if (threads < 1 || threads > 256) threads = 1;
    for (int r = 0; r < reps; r++) {
        double z = run(dp_zmm, threads, 12 * 128.0), y = run(dp_ymm, threads, 12 * 64.0);
        printf("threads=%d  vpdpbusd zmm: %.1f GOPS   vpdpbusd ymm: %.1f GOPS\n", threads, z, y);
    }
    return 0;
}
