// The int8 floor of this CPU for Q8_0 products, against what our kernel reaches
// (bench/bench_int8_floor.py compiles and runs it; prints one JSON object).
//
// Costs are per block-row: one 32-weight Q8_0 block times one activation row (32 multiply-adds),
// in cycles of the time-stamp counter (the nominal clock), one thread.
//   mix_*  the AVX2 instruction sequences on registers only: 8 independent block-rows an
//          iteration, nothing loaded, so only the execution ports limit them:
//          madd        vpmaddubsw + vpmaddwd (the int8 multiply-add itself)
//          signed      + vpsignb (Q8_0 quants are signed: |w| and sign(a, w) feed maddubs)
//          stock       + vcvtdq2ps + vfmadd231ps (ggml's vec_dot_q8_0_q8_0 order: each block's
//                      8 int32 lanes converted and fma'd with the block's scale product)
//          stock_bcast + the scale product broadcast from memory, as a kernel must
//          vnni512, vnni512_bcast (AVX-512 VNNI builds only) the 512-bit path's sequence
//                      (q8_matmul_avx512.inc), two block-rows a register, without and with the
//                      scale products broadcast from memory
//   tile_* specserve_q8_0_matmul_scaled (native/llama_cpp/q8_matmul.cpp) on the served model's
//          matmuls (SmolLM2-135M: 30 layers x q, k, v, o, gate, up, down, and the output), in the
//          row chunks ggml_hook.c gives a thread, for t activation rows:
//          hot   every chunk reads the same first rows of its matrix (in L1/L2: compute only)
//          cold  the whole model's weights (143 MB), as a decoding step reads them
//          cold on N threads: the chunks of each matrix shared out as ggml shares them (first
//                free chunk; all threads meet before the next matrix), the engine's case
//   lanes_* a prototype of another arithmetic (not in the product): the weights repacked 8 rows to a
//          group so that SIMD lanes are weight rows; a block's 32 products are summed exactly in
//          int32 per row, then one convert and one fma per block serve 8 rows (no per-pair
//          broadcast, no horizontal sum). A different order of float sums than ggml's vec_dot, so
//          not bit-identical to stock: what it would buy is measured here, checked against the
//          specification (q8_matmul.h) to float rounding.
#include "q8_matmul.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <x86intrin.h>

#include <vector>

static double tsc_ghz() {  // TSC ticks a nanosecond, against the monotonic clock
    timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    const uint64_t t0 = __rdtsc();
    do { clock_gettime(CLOCK_MONOTONIC, &b); } while ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec) < 2e8);
    const uint64_t t1 = __rdtsc();
    return (double)(t1 - t0) / ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec));
}

#define CLOBBERS "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", \
                 "xmm11", "xmm12", "xmm13", "xmm14", "memory"
// one block-row: t = temporary, acc = accumulator; ymm8..ymm12 are inputs never written
#define MADD(t, acc) "vpmaddubsw %%ymm9, %%ymm10, " t "\n vpmaddwd %%ymm11, " t ", " t "\n vpaddd " t ", " acc ", " acc "\n"
#define SIGNED(t, acc) "vpsignb %%ymm8, %%ymm9, " t "\n vpmaddubsw " t ", %%ymm10, " t "\n vpmaddwd %%ymm11, " t ", " t "\n vpaddd " t ", " acc ", " acc "\n"
#define STOCK(t, acc) "vpsignb %%ymm8, %%ymm9, " t "\n vpmaddubsw " t ", %%ymm10, " t "\n vpmaddwd %%ymm11, " t ", " t "\n vcvtdq2ps " t ", " t "\n vfmadd231ps %%ymm12, " t ", " acc "\n"
#define BCAST(t, acc, off) "vbroadcastss " off "(%0), %%ymm13\n vpsignb %%ymm8, %%ymm9, " t "\n vpmaddubsw " t ", %%ymm10, " t "\n vpmaddwd %%ymm11, " t ", " t "\n vcvtdq2ps " t ", " t "\n vfmadd231ps %%ymm13, " t ", " acc "\n"
#define EIGHT(M) M("%%ymm0", "%%ymm4") M("%%ymm1", "%%ymm5") M("%%ymm2", "%%ymm6") M("%%ymm3", "%%ymm7") \
                 M("%%ymm0", "%%ymm4") M("%%ymm1", "%%ymm5") M("%%ymm2", "%%ymm6") M("%%ymm3", "%%ymm7")

#if defined(__AVX512F__) && defined(__AVX512VNNI__)
// the AVX-512 VNNI path's sequence (q8_matmul_avx512.inc), one 512-bit register = two block-rows:
// the accumulator's start copied in (the offset correction), vpdpbusd, convert, fma; and the same
// with the pair's scale products broadcast from memory, as the kernel does
#define VNNI512(t, acc, off) "vmovdqa64 %%zmm8, " t "\n vpdpbusd %%zmm10, %%zmm9, " t "\n vcvtdq2ps " t ", " t "\n vfmadd231ps %%zmm12, " t ", " acc "\n"
#define VNNI512_BCAST(t, acc, off) "vbroadcastsd " off "(%0), %%zmm13\n vmovdqa64 %%zmm8, " t "\n vpdpbusd %%zmm10, %%zmm9, " t "\n vcvtdq2ps " t ", " t "\n vfmadd231ps %%zmm13, " t ", " acc "\n"
#define EIGHT512(M) M("%%zmm0", "%%zmm4", "0") M("%%zmm1", "%%zmm5", "8") M("%%zmm2", "%%zmm6", "16") M("%%zmm3", "%%zmm7", "24") \
                    M("%%zmm0", "%%zmm4", "32") M("%%zmm1", "%%zmm5", "40") M("%%zmm2", "%%zmm6", "48") M("%%zmm3", "%%zmm7", "56")
#define HAVE_VNNI512 1
#endif

static float scratch[64];

template <int K>
static double mix(long iters) {  // TSC cycles per block-row
    const uint64_t t0 = __rdtsc();
    for (long i = 0; i < iters; ++i) {
        if (K == 0) __asm__ volatile(EIGHT(MADD) ::"r"(scratch) : CLOBBERS);
        if (K == 1) __asm__ volatile(EIGHT(SIGNED) ::"r"(scratch) : CLOBBERS);
        if (K == 2) __asm__ volatile(EIGHT(STOCK) ::"r"(scratch) : CLOBBERS);
        if (K == 3) __asm__ volatile(BCAST("%%ymm0", "%%ymm4", "0") BCAST("%%ymm1", "%%ymm5", "4") BCAST("%%ymm2", "%%ymm6", "8")
                                     BCAST("%%ymm3", "%%ymm7", "12") BCAST("%%ymm0", "%%ymm4", "16") BCAST("%%ymm1", "%%ymm5", "20")
                                     BCAST("%%ymm2", "%%ymm6", "24") BCAST("%%ymm3", "%%ymm7", "28") ::"r"(scratch) : CLOBBERS);
    }
    return (double)(__rdtsc() - t0) / (iters * 8.0);
}

#ifdef HAVE_VNNI512
template <int K>
static double mix512(long iters) {  // TSC cycles per block-row (16 a loop: 8 registers of two)
    const uint64_t t0 = __rdtsc();
    for (long i = 0; i < iters; ++i) {
        if (K == 0) __asm__ volatile(EIGHT512(VNNI512) ::"r"(scratch) : CLOBBERS);
        if (K == 1) __asm__ volatile(EIGHT512(VNNI512_BCAST) ::"r"(scratch) : CLOBBERS);
    }
    return (double)(__rdtsc() - t0) / (iters * 16.0);
}
#endif

struct Matrix {
    int64_t rows, nb;
    std::vector<specserve_block_q8_0> w;
};

// -- the rows-in-lanes prototype ---------------------------------------------------------
struct RowGroup {   // 8 weight rows x one block
    float d[8];         // the rows' scales
    int8_t q[8][32];    // q[g][4 r + j] = row r's quant 4 g + j
};

static std::vector<RowGroup> repack(const Matrix & m) {  // [row group][block]
    std::vector<RowGroup> out((m.rows / 8) * m.nb);
    for (int64_t r = 0; r < m.rows; ++r) {
        for (int64_t b = 0; b < m.nb; ++b) {
            RowGroup & g = out[(r / 8) * m.nb + b];
            const specserve_block_q8_0 & x = m.w[r * m.nb + b];
            g.d[r % 8] = _cvtsh_ss(x.d);
            for (int k = 0; k < 32; ++k) g.q[k / 4][4 * (r % 8) + k % 4] = x.qs[k];
        }
    }
    return out;
}

// dst[c * dst_stride + 8 gi + r] for C activation rows (quants a[c][block][32], scales ad[c][block])
template <int C>
static void lanes_tile(const RowGroup * w, int64_t groups, int64_t nb, const int8_t * a, const float * ad, float * dst,
                       int64_t dst_stride) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t gi = 0; gi < groups; ++gi) {
        const RowGroup * g = w + gi * nb;
        __m256 acc[C];
        for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; ++b) {
            for (int line = 0; line < (int)sizeof(RowGroup); line += 64) _mm_prefetch((const char *)(g + nb + b) + line, _MM_HINT_T0);
            __m256i sums[C];
            for (int c = 0; c < C; ++c) sums[c] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int k = 0; k < 8; ++k) {
                const __m256i wq = _mm256_loadu_si256((const __m256i *)g[b].q[k]);
                const __m256i wabs = _mm256_sign_epi8(wq, wq);
#pragma GCC unroll 4
                for (int c = 0; c < C; ++c) {
                    int32_t four;
                    memcpy(&four, a + (c * nb + b) * 32 + 4 * k, 4);
                    const __m256i p = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(_mm256_set1_epi32(four), wq));
                    sums[c] = _mm256_add_epi32(sums[c], _mm256_madd_epi16(p, ones));
                }
            }
            const __m256 wd = _mm256_loadu_ps(g[b].d);
            for (int c = 0; c < C; ++c) {
                acc[c] = _mm256_fmadd_ps(_mm256_mul_ps(wd, _mm256_broadcast_ss(ad + c * nb + b)), _mm256_cvtepi32_ps(sums[c]), acc[c]);
            }
        }
        for (int c = 0; c < C; ++c) _mm256_storeu_ps(dst + c * dst_stride + 8 * gi, acc[c]);
    }
}

static void lanes_matmul(const RowGroup * w, int64_t rows, int64_t nb, int t, const int8_t * a, const float * ad, float * dst,
                         int64_t dst_stride) {
    for (int c0 = 0; c0 < t; c0 += 4) {  // 4 activation rows at a time, as the stock-order tile
        const int8_t * ac = a + c0 * nb * 32;
        const float * adc = ad + c0 * nb;
        float * o = dst + c0 * dst_stride;
        switch (t - c0 < 4 ? t - c0 : 4) {
            case 4: lanes_tile<4>(w, rows / 8, nb, ac, adc, o, dst_stride); break;
            case 3: lanes_tile<3>(w, rows / 8, nb, ac, adc, o, dst_stride); break;
            case 2: lanes_tile<2>(w, rows / 8, nb, ac, adc, o, dst_stride); break;
            default: lanes_tile<1>(w, rows / 8, nb, ac, adc, o, dst_stride); break;
        }
    }
}

int main(int argc, char ** argv) {
    const int rounds = argc > 1 ? atoi(argv[1]) : 7;
    const int threads = argc > 2 ? atoi(argv[2]) : 2;
    const double ghz = tsc_ghz();
    srand(1);
    std::vector<Matrix> model;
    auto add = [&](int64_t rows, int64_t k) {
        Matrix m{rows, k / 32, std::vector<specserve_block_q8_0>(rows * (k / 32))};
        for (auto & b : m.w) {
            b.d = 0x2000 + (rand() & 0xff);
            for (auto & q : b.qs) q = (int8_t)(rand() % 255 - 127);
        }
        model.push_back(std::move(m));
    };
    for (int layer = 0; layer < 30; ++layer) {
        add(576, 576); add(192, 576); add(192, 576); add(576, 576); add(1536, 576); add(1536, 576); add(576, 1536);
    }
    add(49152, 576);
    double block_rows = 0, bytes = 0;
    for (auto & m : model) block_rows += (double)m.rows * m.nb, bytes += (double)m.rows * m.nb * sizeof(specserve_block_q8_0);
    std::vector<specserve_block_q8_0> act(16 * 48);
    for (auto & b : act) {
        b.d = 0x2400;
        for (auto & q : b.qs) q = (int8_t)(rand() % 255 - 127);
    }
    const size_t scales_size = specserve_q8_0_act_scales_size(16, 48);
    std::vector<float> dst(16 * 49152);
    auto step = [&](int t, bool hot, int nth) {  // TSC cycles for every matmul of one step on nth threads
        const uint64_t t0 = __rdtsc();
#pragma omp parallel num_threads(nth)
        {
            // each thread lays out its own, as ggml_hook.c does, 64-byte aligned as it allocates it
            std::vector<float> own_buf(scales_size + 16);
            float * own_scales = (float *)(((uintptr_t)own_buf.data() + 63) & ~(uintptr_t)63);
            for (auto & m : model) {
                const size_t row_bytes = m.nb * sizeof(specserve_block_q8_0);
                specserve_q8_0_act_scales(act.data(), row_bytes, t, m.nb, own_scales);
                int64_t chunk = (m.rows + 4 * threads - 1) / (4 * threads);  // ggml_hook.c's weight_chunk
                chunk = chunk < 16 ? 16 : chunk > 64 ? 64 : chunk;
                chunk = (chunk + 3) & ~(int64_t)3;
#pragma omp for schedule(dynamic, 1)
                for (int64_t r0 = 0; r0 < m.rows; r0 += chunk) {
                    const int64_t n = m.rows - r0 < chunk ? m.rows - r0 : chunk;
                    specserve_q8_0_matmul_scaled(m.w.data() + (hot ? 0 : r0 * m.nb), row_bytes, n, act.data(), row_bytes,
                                                 t, m.nb, own_scales, dst.data() + r0, m.rows);
                }
            }
        }
        return (double)(__rdtsc() - t0);
    };
    // the prototype's inputs: the same weights repacked, the activations as plain quants and scales
    std::vector<std::vector<RowGroup>> packed;
    for (auto & m : model) packed.push_back(repack(m));
    std::vector<int8_t> act_q(16 * 48 * 32);
    std::vector<float> act_d(16 * 48);
    auto lay_out = [&](int t, int64_t nb) {  // t activation rows as the prototype reads them, rows of nb blocks
        for (int c = 0; c < t; ++c) {
            for (int64_t b = 0; b < nb; ++b) {
                memcpy(&act_q[(c * nb + b) * 32], act[c * nb + b].qs, 32);
                act_d[c * nb + b] = _cvtsh_ss(act[c * nb + b].d);
            }
        }
    };
    auto lanes_step = [&](int t, bool hot) {  // TSC cycles, one thread, chunks of 64 rows (a multiple of 8)
        const uint64_t t0 = __rdtsc();
        for (size_t i = 0; i < model.size(); ++i) {
            const Matrix & m = model[i];
            lay_out(t, m.nb);
            for (int64_t r0 = 0; r0 < m.rows; r0 += 64) {
                const int64_t n = m.rows - r0 < 64 ? m.rows - r0 : 64;
                lanes_matmul(packed[i].data() + (hot ? 0 : (r0 / 8) * m.nb), n, m.nb, t, act_q.data(), act_d.data(),
                             dst.data() + r0, m.rows);
            }
        }
        return (double)(__rdtsc() - t0);
    };
    // the prototype against the specification (q8_matmul.h) on the down projection (48 blocks), 5 rows
    double lanes_max_diff = 0;
    {
        const Matrix & m = model[6];
        std::vector<float> want(5 * m.rows), got(5 * m.rows);
        const size_t row_bytes = m.nb * sizeof(specserve_block_q8_0);
        specserve_q8_0_matmul_ref(m.w.data(), row_bytes, m.rows, act.data(), row_bytes, 5, m.nb, want.data(), m.rows);
        lay_out(5, m.nb);
        lanes_matmul(packed[6].data(), m.rows, m.nb, 5, act_q.data(), act_d.data(), got.data(), m.rows);
        double diff = 0, scale = 0;  // the largest difference against the largest output
        for (size_t i = 0; i < want.size(); ++i) {
            diff = fmax(diff, fabs((double)got[i] - want[i]));
            scale = fmax(scale, fabs((double)want[i]));
        }
        lanes_max_diff = diff / scale;
    }
    const int ts[] = {1, 2, 4, 8, 16};
    double best_mix[6] = {1e30, 1e30, 1e30, 1e30, 1e30, 1e30}, best_hot[5], best_cold[5], best_par[5], lanes_hot[5], lanes_cold[5];
    for (int i = 0; i < 5; ++i) best_hot[i] = best_cold[i] = best_par[i] = lanes_hot[i] = lanes_cold[i] = 1e30;
    for (int r = 0; r < rounds; ++r) {  // alternate everything round by round: this host drifts
        double m;
        if ((m = mix<0>(2000000)) < best_mix[0]) best_mix[0] = m;
        if ((m = mix<1>(2000000)) < best_mix[1]) best_mix[1] = m;
        if ((m = mix<2>(2000000)) < best_mix[2]) best_mix[2] = m;
        if ((m = mix<3>(2000000)) < best_mix[3]) best_mix[3] = m;
#ifdef HAVE_VNNI512
        if ((m = mix512<0>(1000000)) < best_mix[4]) best_mix[4] = m;
        if ((m = mix512<1>(1000000)) < best_mix[5]) best_mix[5] = m;
#endif
        for (int i = 0; i < 5; ++i) {
            if ((m = step(ts[i], true, 1)) < best_hot[i]) best_hot[i] = m;
            if ((m = step(ts[i], false, 1)) < best_cold[i]) best_cold[i] = m;
            if ((m = step(ts[i], false, threads)) < best_par[i]) best_par[i] = m;
            if ((m = lanes_step(ts[i], true)) < lanes_hot[i]) lanes_hot[i] = m;
            if ((m = lanes_step(ts[i], false)) < lanes_cold[i]) lanes_cold[i] = m;
        }
        fprintf(stderr, "round %d/%d\n", r + 1, rounds);
    }
    printf("{\"isa\": \"%s\", \"tsc_ghz\": %.4f, \"block_rows_per_token\": %.0f, \"weight_bytes\": %.0f, \"threads\": %d,\n",
           specserve_q8_0_matmul_isa(), ghz, block_rows, bytes, threads);
    printf(" \"mix_cycles\": {\"madd\": %.3f, \"signed\": %.3f, \"stock\": %.3f, \"stock_bcast\": %.3f", best_mix[0],
           best_mix[1], best_mix[2], best_mix[3]);
#ifdef HAVE_VNNI512
    printf(", \"vnni512\": %.3f, \"vnni512_bcast\": %.3f", best_mix[4], best_mix[5]);
#endif
    printf("},\n");
    printf(" \"lanes_max_diff_of_scale\": %.3g,\n", lanes_max_diff);
    printf(" \"tile\": [");
    for (int i = 0; i < 5; ++i) {
        printf("%s{\"t\": %d, \"hot_ms\": %.3f, \"cold_ms\": %.3f, \"cold_ms_threads\": %.3f, \"hot_cycles\": %.3f, "
               "\"cold_cycles\": %.3f, \"lanes_hot_ms\": %.3f, \"lanes_cold_ms\": %.3f, \"lanes_hot_cycles\": %.3f}",
               i ? ", " : "", ts[i], best_hot[i] / ghz / 1e6, best_cold[i] / ghz / 1e6, best_par[i] / ghz / 1e6,
               best_hot[i] / (block_rows * ts[i]), best_cold[i] / (block_rows * ts[i]), lanes_hot[i] / ghz / 1e6,
               lanes_cold[i] / ghz / 1e6, lanes_hot[i] / (block_rows * ts[i]));
    }
    printf("]}\n");
    return 0;
}
