// specserve's Q8_0 x Q8_0 matmul: see q8_matmul.h for the arithmetic every path computes.
//
// Why it is faster than the stock kernels: llama.cpp computes one row with vec_dot (one dependent
// chain a weight row, each row fetched as it is read: decoding waits on latency) and 2+ rows
// with llamafile's tinyBLAS, whose
// AVX2 tiles are 4 weight rows x 2 activation rows and recompute |w| and the scale products
// for every pair. Here a tile is R weight rows x C activation rows; per block it loads each
// weight row once, takes |w| once, and each pair costs sign, multiply-add (maddubs + madd, or
// one dpbusd with AVX-VNNI), convert, scale, fma. The tile walks all activation rows of a chunk
// while its weight rows sit in L1, so a call reads the weights from memory once; one row keeps R
// independent chains and the weights 8 KiB ahead in flight (PREFETCH_L2).
//
// Paths, chosen at compile time (-march=native, as ggml chooses its own): AVX-512 with VNNI
// (q8_matmul_avx512.inc: two block-rows a 512-bit instruction, no per-pair sign), else the
// 256-bit AVX2 / AVX-VNNI tiles below, else the plain-C specification. All compute the same bits.
#include "q8_matmul.h"

#include <math.h>
#include <string.h>

#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define SPECSERVE_SIMD 1
#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__AVX512VNNI__)
#define SPECSERVE_AVX512 1  // 512-bit vpdpbusd: two block-rows an instruction (q8_matmul_avx512.inc)
#endif

// How far ahead of a tile its weight rows are fetched into L2, beside the next tile's rows into L1.
// One activation row (decoding) computes a tile in a few dozen cycles, so the next tile alone was
// too near to hide memory's latency: with the rows 8 KiB ahead in flight too, one decoding step
// on a build limited to AVX2 on a 2-core Sapphire Rapids VM took 7.3 ms instead of 9.1 (4 KiB 7.5,
// 16 KiB 7.8; ggml's vec_dot, which served one row before, 10.5).
constexpr size_t PREFETCH_L2 = 8192;

static inline float hsum8(__m256 x) {  // ggml's hsum_float_8: every SIMD path's last sum
    __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    return _mm_cvtss_f32(r);
}
#endif

// -- the specification, in plain C --------------------------------------------------------

extern "C" float specserve_half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);  // inf / nan
    } else if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else {  // subnormal half: normalise
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400));
            bits = sign | (uint32_t)(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
        }
    } else {
        bits = sign | (exp + 127 - 15) << 23 | man << 13;
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static float dot_ref(const specserve_block_q8_0 * w, const specserve_block_q8_0 * a, int64_t nb) {
    float acc[8] = {0};
    for (int64_t b = 0; b < nb; ++b) {
        const float d = specserve_half_to_float(w[b].d) * specserve_half_to_float(a[b].d);
        for (int l = 0; l < 8; ++l) {
            int32_t q = 0;
            for (int j = 0; j < 4; ++j) {
                q += (int32_t)w[b].qs[4 * l + j] * (int32_t)a[b].qs[4 * l + j];
            }
            acc[l] = fmaf(d, (float)q, acc[l]);
        }
    }
    return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
}

extern "C" void specserve_q8_0_matmul_ref(const void * w, size_t w_row_bytes, int64_t n_w,
                                          const void * a, size_t a_row_bytes, int64_t n_a,
                                          int64_t nb, float * dst, size_t dst_stride) {
    for (int64_t c = 0; c < n_a; ++c) {
        const auto * ac = (const specserve_block_q8_0 *)((const char *)a + c * a_row_bytes);
        for (int64_t r = 0; r < n_w; ++r) {
            const auto * wr = (const specserve_block_q8_0 *)((const char *)w + r * w_row_bytes);
            dst[c * dst_stride + r] = dot_ref(wr, ac, nb);
        }
    }
}

#ifndef SPECSERVE_SIMD

extern "C" void specserve_q8_0_matmul(const void * w, size_t w_row_bytes, int64_t n_w,
                                      const void * a, size_t a_row_bytes, int64_t n_a,
                                      int64_t nb, float * dst, size_t dst_stride) {
    specserve_q8_0_matmul_ref(w, w_row_bytes, n_w, a, a_row_bytes, n_a, nb, dst, dst_stride);
}

extern "C" size_t specserve_q8_0_act_scales_size(int64_t n_a, int64_t nb) { return 0; }

extern "C" const float * specserve_q8_0_act_scales_from(const float * act_scales, int64_t, int64_t) { return act_scales; }

extern "C" void specserve_q8_0_act_scales(const void *, size_t, int64_t, int64_t, float *) {}

extern "C" void specserve_q8_0_matmul_scaled(const void * w, size_t w_row_bytes, int64_t n_w,
                                             const void * a, size_t a_row_bytes, int64_t n_a, int64_t nb,
                                             const float *, float * dst, size_t dst_stride) {
    specserve_q8_0_matmul_ref(w, w_row_bytes, n_w, a, a_row_bytes, n_a, nb, dst, dst_stride);
}

extern "C" const char * specserve_q8_0_matmul_isa(void) { return "ref"; }

#elif defined(SPECSERVE_AVX512)

#include "q8_matmul_avx512.inc"

#else

// -- x86 SIMD, 256-bit (AVX2, AVX-VNNI) -----------------------------------------------------

// int32 lanes l = sum of 4 products x[4l..4l+3] * y[4l..4l+3] (exact); |x| must fit a u8
// (Q8_0 quants are in [-127, 127]), and with maddubs a pair of products fits an int16.
static inline __m256i dot_lanes(__m256i ax, __m256i sy) {
#if defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), ax, sy);
#else
    return _mm256_madd_epi16(_mm256_set1_epi16(1), _mm256_maddubs_epi16(ax, sy));
#endif
}

// Tiles are 2 weight rows x 4 activation rows (AVX2's 16 registers: 8 accumulators, |w| of
// the 2 weight blocks, the activation block, temporaries). Per block a tile's 8 scale products
// fp32(d_w) * fp32(d_a) come from one multiply of two 8-float vectors laid out for it:
//   wd:  [block][2]            the weight rows' scales, read as [w0 w1 w0 w1 w0 w1 w0 w1]
//   act: [group][block][8]     per group of 4 activation rows [a0 a0 a1 a1 a2 a2 a3 a3]
// so the pair's product is P[2c + r], broadcast from memory: the loop's multiply ports then do
// only maddubs, madd and the fma (measured 17% faster than a multiply per pair).
constexpr int TR = 2, TC = 4;
static_assert(SPECSERVE_Q8_0_ACT_GROUP % TC == 0, "callers start chunks on whole groups");

template <int C>  // C <= TC activation rows of one group (the last group may hold fewer)
static inline void tile(const char * w, size_t ws, int R, const char * a, size_t as, int64_t nb,
                        const float * wd, const float * act, float * dst, size_t dst_stride, const char * ahead) {
    __m256 acc[TR][C];
#pragma GCC unroll 8
    for (int r = 0; r < TR; ++r) {
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    }
    // R = 1 (an odd last weight row): the second row reads the first again; its sums are dropped
    const size_t ws2 = R == 2 ? ws : 0;
    alignas(32) float prod[8];
    for (int64_t b = 0; b < nb; ++b) {
        if (ahead) {  // the next weight rows start their way from memory under this tile's compute
            _mm_prefetch(ahead + b * sizeof(specserve_block_q8_0), _MM_HINT_T0);
            _mm_prefetch(ahead + ws + b * sizeof(specserve_block_q8_0), _MM_HINT_T0);
            _mm_prefetch(ahead + PREFETCH_L2 + b * sizeof(specserve_block_q8_0), _MM_HINT_T1);
            _mm_prefetch(ahead + PREFETCH_L2 + ws + b * sizeof(specserve_block_q8_0), _MM_HINT_T1);
        }
        const __m256 wv = _mm256_castpd_ps(_mm256_broadcast_sd((const double *)(wd + 2 * b)));
        _mm256_store_ps(prod, _mm256_mul_ps(wv, _mm256_loadu_ps(act + 8 * b)));
        const auto * w0 = (const specserve_block_q8_0 *)w + b;
        const auto * w1 = (const specserve_block_q8_0 *)(w + ws2) + b;
        const __m256i wq0 = _mm256_loadu_si256((const __m256i *)w0->qs);
        const __m256i wq1 = _mm256_loadu_si256((const __m256i *)w1->qs);
        const __m256i wabs[TR] = {_mm256_sign_epi8(wq0, wq0), _mm256_sign_epi8(wq1, wq1)};
#pragma GCC unroll 8
        for (int c = 0; c < C; ++c) {
            const __m256i aq = _mm256_loadu_si256((const __m256i *)((const specserve_block_q8_0 *)(a + c * as) + b)->qs);
#pragma GCC unroll 8
            for (int r = 0; r < TR; ++r) {
                // w is loaded again rather than kept: the registers go to the accumulators
                const __m256i wq = _mm256_loadu_si256((const __m256i *)(r == 0 ? w0 : w1)->qs);
                const __m256 q = _mm256_cvtepi32_ps(dot_lanes(wabs[r], _mm256_sign_epi8(aq, wq)));
                acc[r][c] = _mm256_fmadd_ps(_mm256_broadcast_ss(prod + 2 * c + r), q, acc[r][c]);
            }
        }
    }
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
#pragma GCC unroll 8
        for (int r = 0; r < TR; ++r) {
            if (r < R) dst[c * dst_stride + r] = hsum8(acc[r][c]);
        }
    }
}

extern "C" size_t specserve_q8_0_act_scales_size(int64_t n_a, int64_t nb) {
    return (size_t)((n_a + TC - 1) / TC) * nb * 8;
}

extern "C" const float * specserve_q8_0_act_scales_from(const float * act_scales, int64_t row, int64_t nb) {
    return act_scales + (row / TC) * nb * 8;
}

extern "C" void specserve_q8_0_act_scales(const void * a, size_t a_row_bytes, int64_t n_a, int64_t nb, float * out) {
    for (int64_t g = 0; g * TC < n_a; ++g) {
        float * o = out + g * nb * 8;
        for (int64_t b = 0; b < nb; ++b) {
            for (int c = 0; c < TC; ++c) {
                const int64_t row = g * TC + c;
                const float d = row < n_a ? _cvtsh_ss(((const specserve_block_q8_0 *)((const char *)a + row * a_row_bytes) + b)->d) : 0.0f;
                o[8 * b + 2 * c] = o[8 * b + 2 * c + 1] = d;
            }
        }
    }
}

extern "C" void specserve_q8_0_matmul_scaled(const void * w, size_t w_row_bytes, int64_t n_w,
                                             const void * a, size_t a_row_bytes, int64_t n_a, int64_t nb,
                                             const float * act_scales, float * dst, size_t dst_stride) {
    const char * wc = (const char *)w;
    const char * ac = (const char *)a;
    static thread_local std::vector<float> wd_buf;
    std::vector<float> & wd = wd_buf;  // one TLS lookup
    if (wd.size() < (size_t)(2 * nb)) wd.resize(2 * nb);
    for (int64_t r = 0; r < n_w; r += TR) {
        const int R = n_w - r >= TR ? TR : 1;
        for (int64_t b = 0; b < nb; ++b) {  // this pair of weight rows' scales, once for every activation row
            wd[2 * b] = _cvtsh_ss(((const specserve_block_q8_0 *)(wc + r * w_row_bytes) + b)->d);
            wd[2 * b + 1] = R == 2 ? _cvtsh_ss(((const specserve_block_q8_0 *)(wc + (r + 1) * w_row_bytes) + b)->d) : 0.0f;
        }
        const char * wr = wc + r * w_row_bytes;
        for (int64_t c = 0; c < n_a; c += TC) {
            const float * act = specserve_q8_0_act_scales_from(act_scales, c, nb);
            float * out = dst + c * dst_stride + r;
            // the first tile of a row pair fetches the next pair (two rows on: past n_w it stops)
            const char * ahead = c == 0 && r + 2 * TR <= n_w ? wr + TR * w_row_bytes : nullptr;
            const char * ar = ac + c * a_row_bytes;
            switch (n_a - c >= TC ? TC : n_a - c) {
                case 4: tile<4>(wr, w_row_bytes, R, ar, a_row_bytes, nb, wd.data(), act, out, dst_stride, ahead); break;
                case 3: tile<3>(wr, w_row_bytes, R, ar, a_row_bytes, nb, wd.data(), act, out, dst_stride, ahead); break;
                case 2: tile<2>(wr, w_row_bytes, R, ar, a_row_bytes, nb, wd.data(), act, out, dst_stride, ahead); break;
                default: tile<1>(wr, w_row_bytes, R, ar, a_row_bytes, nb, wd.data(), act, out, dst_stride, ahead); break;
            }
        }
    }
}

extern "C" void specserve_q8_0_matmul(const void * w, size_t w_row_bytes, int64_t n_w,
                                      const void * a, size_t a_row_bytes, int64_t n_a,
                                      int64_t nb, float * dst, size_t dst_stride) {
    static thread_local std::vector<float> act;
    act.resize(specserve_q8_0_act_scales_size(n_a, nb));
    specserve_q8_0_act_scales(a, a_row_bytes, n_a, nb, act.data());
    specserve_q8_0_matmul_scaled(w, w_row_bytes, n_w, a, a_row_bytes, n_a, nb, act.data(), dst, dst_stride);
}

extern "C" const char * specserve_q8_0_matmul_isa(void) {
#if defined(__AVXVNNI__)
    return "avxvnni";
#else
    return "avx2";
#endif
}

#endif
