/* AMX int8 tile throughput (tdpbusd), for "% of peak" of a future x86-amx row (issue 27).
 *
 *   gcc -O2 -mamx-tile -mamx-int8 -pthread peak_amx.c -o peak_amx && ./peak_amx [threads] [reps]
 *
 * Asks Linux for the tile data state once per process (arch_prctl(ARCH_REQ_XCOMP_PERM,
 * XFEATURE_XTILEDATA)) and says so when the kernel refuses; checks one tdpbusd against a scalar
 * reference (u8 A 16x64 row-major, s8 B in AMX's layout: 16 rows of K/4, each 16 columns x 4 bytes,
 * int32 C 16x16); then times 4 independent tdpbusd per step (C tiles 0-3 from A tiles 4-5 and B tiles
 * 6-7, nothing loaded in the loop). One tdpbusd: 16 x 16 x 64 u8 x s8 MACs = 32768 ops.
 * Prints GOPS per thread count, one line per repetition. */
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define ITERS 5000000L
#define OPS_PER_TDP (16.0 * 16.0 * 64.0 * 2.0)

typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void configure(void) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;  /* C: 16 int32; A: 64 u8 of K; B: 16 columns x 4 bytes */
    }
    _tile_loadconfig(&cfg);
}

static uint8_t A[16][64];
static int8_t B[16][64];  /* B[k / 4][4 * n + k % 4] = W[k][n] */
static int32_t C[16][16];

static int check(void) {
    int8_t w[64][16];
    for (int i = 0; i < 16; i++)
        for (int k = 0; k < 64; k++) A[i][k] = (uint8_t)(i * 37 + k * 11 + 200);
    for (int k = 0; k < 64; k++)
        for (int n = 0; n < 16; n++) {
            w[k][n] = (int8_t)(k * 13 - n * 29 - 100);
            B[k / 4][4 * n + k % 4] = w[k][n];
        }
    configure();
    _tile_zero(0);
    _tile_loadd(4, A, 64);
    _tile_loadd(6, B, 64);
    _tile_dpbusd(0, 4, 6);
    _tile_stored(0, C, 64);
    _tile_release();
    int bad = 0;
    for (int i = 0; i < 16; i++)
        for (int n = 0; n < 16; n++) {
            int32_t want = 0;
            for (int k = 0; k < 64; k++) want += (int32_t)A[i][k] * (int32_t)w[k][n];
            bad += C[i][n] != want;
        }
    return bad;
}

static void *loop(void *arg) {
    (void)arg;
    configure();
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    _tile_loadd(4, A, 64); _tile_loadd(5, A, 64);
    _tile_loadd(6, B, 64); _tile_loadd(7, B, 64);
    for (long it = 0; it < ITERS; it++) {
        _tile_dpbusd(0, 4, 6);
        _tile_dpbusd(1, 4, 7);
        _tile_dpbusd(2, 5, 6);
        _tile_dpbusd(3, 5, 7);
    }
    _tile_stored(0, C, 64);
    _tile_release();
    return NULL;
}

int main(int argc, char **argv) {
    int max_threads = argc > 1 ? atoi(argv[1]) : 1, reps = argc > 2 ? atoi(argv[2]) : 3;
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)) {
        perror("arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA): this kernel refuses AMX tile data");
        return 2;
    }
    int bad = check();
    printf("tdpbusd check: %s (%d of 256 results differ from the scalar reference)\n", bad ? "WRONG" : "exact", bad);
    if (bad) return 1;
    for (int threads = 1; threads <= max_threads; threads *= 2) {
        for (int r = 0; r < reps; r++) {
            pthread_t t[256];
            double t0 = now();
            for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, loop, NULL);
            for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
            double dt = now() - t0;
            printf("tdpbusd threads=%d GOPS=%.0f (per thread %.0f; %.1f ns per tdpbusd per thread)\n", threads,
                   ITERS * 4 * OPS_PER_TDP * threads / dt / 1e9, ITERS * 4 * OPS_PER_TDP / dt / 1e9, dt / (ITERS * 4.0) * 1e9);
        }
        if (threads * 2 > max_threads) break;
    }
    return 0;
}
