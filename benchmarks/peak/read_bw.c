/* Streaming read bandwidth over a buffer of a given size, by one thread or several: the memory side of
 * the performance model's roofline (tvm_lowprec.perfmodel.Memory), e.g. at the size of a GEMV's weights.
 *
 *   gcc -O2 -mavx2 -pthread read_bw.c -o read_bw && ./read_bw [MiB] [reps] [threads]
 *
 * With several threads each reads its own contiguous share of the one buffer, as a parallel GEMV's
 * threads read their halves of the weights; a pass is timed from a barrier before it to a barrier after
 * it, so the figure is what the threads read together (separate processes, each timing its own best
 * pass, overstate it: their best passes need not overlap).
 *
 * Each pass sums the buffer as bytes with vpaddb into 4 independent accumulators (one load per
 * instruction, nothing for the compiler to drop: the sum is printed). The first pass is not timed, so
 * a buffer that fits in the caches is read from them, as a kernel's weights are after the first call.
 * Prints the best pass of each repetition in GB/s (1e9 bytes). */
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static long pass(const __m256i *p, size_t n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n; i += 4) {
        a0 = _mm256_add_epi8(a0, _mm256_load_si256(p + i));
        a1 = _mm256_add_epi8(a1, _mm256_load_si256(p + i + 1));
        a2 = _mm256_add_epi8(a2, _mm256_load_si256(p + i + 2));
        a3 = _mm256_add_epi8(a3, _mm256_load_si256(p + i + 3));
    }
    __m256i s = _mm256_add_epi8(_mm256_add_epi8(a0, a1), _mm256_add_epi8(a2, a3));
    return _mm256_extract_epi8(s, 0) + _mm256_extract_epi8(s, 31);
}

#define MAX_THREADS 64

typedef struct {
    const __m256i *share;  /* this thread's contiguous part of the buffer */
    size_t n;              /* its 32-byte vectors (a multiple of 4) */
    int id, passes;
    long check;
} worker;

static pthread_barrier_t gate;
static double *times;  /* per pass, measured by thread 0 between the two barriers */

static void *work(void *arg) {
    worker *w = arg;
    for (int i = 0; i < w->passes; i++) {
        pthread_barrier_wait(&gate);
        double t0 = w->id == 0 ? now() : 0.0;
        w->check += pass(w->share, w->n);
        pthread_barrier_wait(&gate);
        if (w->id == 0) times[i] = now() - t0;
    }
    return NULL;
}

int main(int argc, char **argv) {
    double mib = argc > 1 ? atof(argv[1]) : 16.0;
    int reps = argc > 2 ? atoi(argv[2]) : 3;
    int threads = argc > 3 ? atoi(argv[3]) : 1;
    if (threads < 1 || threads > MAX_THREADS) return 2;
    size_t bytes = ((size_t)(mib * 1048576.0) + 128 * threads - 1) / (128 * threads) * (128 * threads);
    size_t n = bytes / 32;
    __m256i *buf = aligned_alloc(64, bytes);
    if (!buf) return 1;
    for (size_t i = 0; i < bytes; i++) ((unsigned char *)buf)[i] = (unsigned char)(i * 7);
    long check = pass(buf, n);  /* untimed: a buffer that fits in the caches is then read from them */
    int passes = (int)(2e9 / bytes) + 3;  /* about 2 GB read per repetition */
    times = malloc(sizeof(double) * passes);
    pthread_barrier_init(&gate, NULL, (unsigned)threads);
    for (int r = 0; r < reps; r++) {
        worker w[MAX_THREADS];
        pthread_t tid[MAX_THREADS];
        for (int t = 0; t < threads; t++) {
            w[t] = (worker){buf + (size_t)t * (n / threads), n / threads, t, passes, 0};
            if (t > 0) pthread_create(&tid[t], NULL, work, &w[t]);
        }
        work(&w[0]);
        for (int t = 1; t < threads; t++) pthread_join(tid[t], NULL);
        double best = 1e30;
        for (int i = 0; i < passes; i++)
            if (times[i] < best) best = times[i];
        for (int t = 0; t < threads; t++) check += w[t].check;
        printf("read %.1f MiB, %d thread%s: %.2f GB/s (check %ld)\n", bytes / 1048576.0, threads,
               threads > 1 ? "s" : "", bytes / best / 1e9, check & 1);
    }
    pthread_barrier_destroy(&gate);
    free(times);
    free(buf);
    return 0;
}
