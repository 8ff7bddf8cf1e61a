/* Streaming read bandwidth of one thread over a buffer of a given size: the memory side of the
 * performance model's roofline (tvm_lowprec.perfmodel.Memory), e.g. at the size of a GEMV's weights.
 *
 *   gcc -O2 -mavx2 read_bw.c -o read_bw && ./read_bw [MiB] [reps]
 *
 * Each pass sums the buffer as bytes with vpaddb into 4 independent accumulators (one load per
 * instruction, nothing for the compiler to drop: the sum is printed). The first pass is not timed, so
 * a buffer that fits in the caches is read from them, as a kernel's weights are after the first call.
 * Prints the best pass of each repetition in GB/s (1e9 bytes). */
#include <immintrin.h>
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

int main(int argc, char **argv) {
    double mib = argc > 1 ? atof(argv[1]) : 16.0;
    int reps = argc > 2 ? atoi(argv[2]) : 3;
    size_t bytes = ((size_t)(mib * 1048576.0) + 127) / 128 * 128, n = bytes / 32;
    __m256i *buf = aligned_alloc(64, bytes);
    if (!buf) return 1;
    for (size_t i = 0; i < bytes; i++) ((unsigned char *)buf)[i] = (unsigned char)(i * 7);
    long check = pass(buf, n);
    int passes = (int)(2e9 / bytes) + 3;  /* about 2 GB read per repetition */
    for (int r = 0; r < reps; r++) {
        double best = 1e30;
        for (int i = 0; i < passes; i++) {
            double t0 = now();
            check += pass(buf, n);
            double t = now() - t0;
            if (t < best) best = t;
        }
        printf("read %.1f MiB: %.2f GB/s (check %ld)\n", bytes / 1048576.0, bytes / best / 1e9, check & 1);
    }
    free(buf);
    return 0;
}
