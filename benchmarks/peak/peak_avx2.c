/* Instruction-throughput ceilings of the exact AVX2 int8 GEMM recipes, for "% of peak" on CPUs
 * without VNNI (shared/bench/peak.c covers vpdpbusd and needs AVX-512).
 *
 *   gcc -O2 -mavx2 -pthread peak_avx2.c -o peak_avx2 && ./peak_avx2 [threads] [reps]
 *
 * vpmaddwd ymm + vpaddd: 16 int16 MACs = 32 ops, as tvm-lowprec's exact vpmaddwd recipe issues them.
 * vpmaddubsw ymm + vpmaddwd (by ones) + vpaddd: 32 u8 x s8 MACs = 64 ops (the weight-bounded recipe).
 * Inline assembly with 8 independent accumulators (ymm0-7) and distinct operands, so nothing is
 * merged or hoisted by the compiler. Prints GOPS per thread count. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define ITERS 50000000L

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

#define WD(a, acc, tmp) "vpmaddwd %%ymm12, %%ymm" #a ", %%ymm" #tmp "\n vpaddd %%ymm" #tmp ", %%ymm" #acc ", %%ymm" #acc "\n"
#define UB(a, acc, tmp)                                                                      \
    "vpmaddubsw %%ymm12, %%ymm" #a ", %%ymm" #tmp "\n vpmaddwd %%ymm13, %%ymm" #tmp ", %%ymm" #tmp \
    "\n vpaddd %%ymm" #tmp ", %%ymm" #acc ", %%ymm" #acc "\n"

static void *madd_wd(void *arg) {
    (void)arg;
    for (long it = 0; it < ITERS; it++)
        __asm__ volatile(WD(8, 0, 14) WD(9, 1, 15) WD(10, 2, 14) WD(11, 3, 15) WD(8, 4, 14) WD(9, 5, 15)
                             WD(10, 6, 14) WD(11, 7, 15)::: "memory");
    return NULL;
}

static void *madd_ubsw(void *arg) {
    (void)arg;
    for (long it = 0; it < ITERS; it++)
        __asm__ volatile(UB(8, 0, 14) UB(9, 1, 15) UB(10, 2, 14) UB(11, 3, 15) UB(8, 4, 14) UB(9, 5, 15)
                             UB(10, 6, 14) UB(11, 7, 15)::: "memory");
    return NULL;
}

static double run(void *(*fn)(void *), int threads, double ops_per_iter) {
    pthread_t t[64];
    double t0 = now();
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, fn, NULL);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    return ops_per_iter * ITERS * threads / (now() - t0) / 1e9;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1, reps = argc > 2 ? atoi(argv[2]) : 3;
    for (int r = 0; r < reps; r++) {
        double wd = run(madd_wd, threads, 8 * 32.0), ub = run(madd_ubsw, threads, 8 * 64.0);
        printf("threads=%d  vpmaddwd ymm: %.1f GOPS   vpmaddubsw ymm: %.1f GOPS\n", threads, wd, ub);
    }
    return 0;
}
