/* Instruction-throughput ceilings of the exact AVX2 int8 GEMM recipes, for "% of peak" on CPUs
 * without VNNI (shared/bench/peak.c covers vpdpbusd and needs AVX-512).
 *
 *   gcc -O2 -mavx2 -mfma -pthread peak_avx2.c -o peak_avx2 && ./peak_avx2 [threads] [reps]
 *
 * vpmaddwd ymm (+ vpaddd): 16 int16 MACs = 32 ops per pair, as tvm-lowprec's vpmaddwd recipe issues them.
 * vpmaddubsw ymm (+ vpmaddwd by ones + vpaddd): 32 u8 x s8 MACs = 64 ops per triple (the bounded recipe).
 * 12 independent accumulators hide the latencies. Prints GOPS per thread count. */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define ITERS 20000000L
#define ACC 12

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static volatile int sink;

static void *madd_wd(void *arg) {
    (void)arg;
    __m256i a = _mm256_set1_epi16(3), b = _mm256_set1_epi16(5), acc[ACC];
    for (int i = 0; i < ACC; i++) acc[i] = _mm256_setzero_si256();
    for (long it = 0; it < ITERS; it++) {
        for (int i = 0; i < ACC; i++) acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(a, b));
        __asm__ volatile("" : "+x"(a), "+x"(b));
    }
    int s = 0;
    for (int i = 0; i < ACC; i++) s += _mm256_extract_epi32(acc[i], 0);
    sink = s;
    return NULL;
}

static void *madd_ubsw(void *arg) {
    (void)arg;
    __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(5), ones = _mm256_set1_epi16(1), acc[ACC];
    for (int i = 0; i < ACC; i++) acc[i] = _mm256_setzero_si256();
    for (long it = 0; it < ITERS; it++) {
        for (int i = 0; i < ACC; i++)
            acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), ones));
        __asm__ volatile("" : "+x"(a), "+x"(b));
    }
    int s = 0;
    for (int i = 0; i < ACC; i++) s += _mm256_extract_epi32(acc[i], 0);
    sink = s;
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
        double wd = run(madd_wd, threads, ACC * 32.0), ub = run(madd_ubsw, threads, ACC * 64.0);
        printf("threads=%d  vpmaddwd ymm: %.1f GOPS   vpmaddubsw ymm: %.1f GOPS\n", threads, wd, ub);
    }
    return 0;
}
