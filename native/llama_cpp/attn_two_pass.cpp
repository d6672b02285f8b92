// specserve: attention in three passes a query (attn_two_pass.h says why and in which order).
#include "attn_two_pass.h"

#include "attn_scores.h"

#include "ggml-cpu-impl.h"
#include "q8_matmul.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>

namespace specserve {

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)

namespace {

constexpr int64_t W = 16;          // keys a vector
constexpr int64_t KEY_BLOCK = 64;  // keys whose V rows are dequantized together
constexpr int64_t DV_STEP = 64;    // output floats a query keeps in registers (4 vectors)
constexpr int QUERIES = 4;         // queries that share a V row's loads

// e^x for x <= 0: x = n ln2 + r (|r| <= ln2 / 2, Cody-Waite in two parts), e^r by its Taylor
// polynomial of degree 6 (error < 2e-7 relative), times 2^n (scalef, exact). Below -88 the
// result is ~0 (denormal or 0), as the true value nearly is.
inline __m512 exp16(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-88.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

// Passes 1 and 2 for one query: its row of scores becomes its weights p_k; returns S.
float softmax_row(float * row, const ggml_fp16_t * mask, int64_t n_keys, float scale) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 mx = ninf;
    for (int64_t k = 0; k < n_keys; k += W) {
        const __mmask16 live = n_keys - k >= W ? (__mmask16)0xffff : (__mmask16)((1u << (n_keys - k)) - 1);
        __m512 s = _mm512_mul_ps(_mm512_loadu_ps(row + k), _mm512_set1_ps(scale));
        if (mask) {
            s = _mm512_add_ps(s, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(live, (const __m256i *)(mask + k))));
        }
        s = _mm512_mask_blend_ps(live, ninf, s);  // past the walk's end: hidden
        _mm512_storeu_ps(row + k, s);
        mx = _mm512_max_ps(mx, s);
    }
    const float m = _mm512_reduce_max_ps(mx);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t k = 0; k < n_keys; k += W) {
        const __m512 s = _mm512_loadu_ps(row + k);
        const __mmask16 seen = _mm512_cmp_ps_mask(s, ninf, _CMP_NEQ_OQ);
        const __m512 p = m == -INFINITY ? _mm512_setzero_ps() : _mm512_maskz_mov_ps(seen, exp16(_mm512_sub_ps(s, _mm512_set1_ps(m))));
        _mm512_storeu_ps(row + k, p);
        sum = _mm512_add_ps(sum, p);
    }
    return _mm512_reduce_add_ps(sum);
}

// V rows of Q8_0 blocks to floats: float(q) * fp32(d).
// Each row is fetched ROWS_AHEAD rows before it is read (specserve_prefetch_row), past this
// block's end too: the next block's rows follow. Unfetched, 40% of the pass's time was the first
// load of a row.
constexpr int64_t ROWS_AHEAD = 32;

// 16 floats of a V row from half of its Q8_0 block: float(q) * fp32(d). Both ways of pass 3 below
// take V's floats from here, so they are the same floats.
inline __m512 dequantize16(const specserve_block_q8_0 & blk, int half) {
    const __m512i q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk.qs + half * W)));
    return _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_set1_ps(_cvtsh_ss(blk.d)));
}

void dequantize_rows(const char * v, size_t row_bytes, int64_t n, int64_t dv, float * out) {
    for (int64_t j = 0; j < n; ++j) {
        specserve_prefetch_row(v + (j + ROWS_AHEAD) * row_bytes, dv / SPECSERVE_QK8_0);
        const auto * blk = (const specserve_block_q8_0 *)(v + j * row_bytes);
        for (int64_t b = 0; b < dv / SPECSERVE_QK8_0; ++b) {
            for (int half = 0; half < SPECSERVE_QK8_0 / W; ++half) {
                _mm512_storeu_ps(out + j * dv + b * SPECSERVE_QK8_0 + half * W, dequantize16(blk[b], half));
            }
        }
    }
}

// Pass 3 for Q queries over a block of nk keys: acc = fma(v_k, p_k, acc), key after key, with 64
// floats of each query in registers and each V vector loaded once for the Q queries. V comes as
// floats (dequantize_rows: one pass serves every group of queries) or, FROM_ROWS, straight from the
// Q8_0 rows, dequantized in registers: for a single group (decoding's 3 queries a KV head) that
// saves a store and a load of each V float beside its 3 fmas. The same floats and fmas in the same
// order either way, so the same bits.
template <int Q, bool FROM_ROWS>
void accumulate(float * const * acc, const float * const * p, const char * v, size_t row_bytes, int64_t nk, int64_t dv) {
    for (int64_t h = 0; h < dv; h += DV_STEP) {
        __m512 a[Q][4];
        for (int q = 0; q < Q; ++q) {
            for (int c = 0; c < 4; ++c) a[q][c] = _mm512_loadu_ps(acc[q] + h + c * W);
        }
        for (int64_t k = 0; k < nk; ++k) {
            __m512 x[4];
            if (FROM_ROWS) {
                if (h == 0) specserve_prefetch_row(v + (k + ROWS_AHEAD) * row_bytes, dv / SPECSERVE_QK8_0);
                const auto * blk = (const specserve_block_q8_0 *)(v + k * row_bytes) + h / SPECSERVE_QK8_0;
                for (int c = 0; c < 4; ++c) x[c] = dequantize16(blk[c / 2], c % 2);
            } else {
                for (int c = 0; c < 4; ++c) x[c] = _mm512_loadu_ps((const float *)v + k * dv + h + c * W);
            }
            for (int q = 0; q < Q; ++q) {
                const __m512 w = _mm512_set1_ps(p[q][k]);
                for (int c = 0; c < 4; ++c) a[q][c] = _mm512_fmadd_ps(x[c], w, a[q][c]);
            }
        }
        for (int q = 0; q < Q; ++q) {
            for (int c = 0; c < 4; ++c) _mm512_storeu_ps(acc[q] + h + c * W, a[q][c]);
        }
    }
}

template <bool FROM_ROWS>
void accumulate_group(int n, float * const * acc, const float * const * p, const char * v, size_t row_bytes, int64_t nk,
                      int64_t dv) {
    switch (n) {
        case 4: accumulate<4, FROM_ROWS>(acc, p, v, row_bytes, nk, dv); break;
        case 3: accumulate<3, FROM_ROWS>(acc, p, v, row_bytes, nk, dv); break;
        case 2: accumulate<2, FROM_ROWS>(acc, p, v, row_bytes, nk, dv); break;
        default: accumulate<1, FROM_ROWS>(acc, p, v, row_bytes, nk, dv); break;
    }
}

}  // namespace

bool two_pass_supported(int64_t dv) {
    return dv % DV_STEP == 0;
}

void attend_two_pass(const char * k_rows, size_t k_row_bytes, const char * v_rows, size_t v_row_bytes,
                     int64_t n_keys, const char * q8, size_t q_row, int64_t nq, int64_t nb_dk, int64_t dv,
                     float scale, const ggml_fp16_t * const * masks, float * scores, float * vrows,
                     float * acc, float * sum) {
    const int64_t pad = (n_keys + W - 1) / W * W;
    for (int64_t j = 0; j < std::min<int64_t>(ROWS_AHEAD, n_keys); ++j) {  // the first V rows, while the scores are made
        specserve_prefetch_row(v_rows + j * v_row_bytes, dv / SPECSERVE_QK8_0);
    }
    // every query's scores at once, by the lanes matmul with the keys in lanes (attn_scores.h):
    // each score the same whatever else is in the call
    specserve_attn_scores(k_rows, k_row_bytes, n_keys, q8, q_row, nq, nb_dk, scores, pad);
    for (int64_t i = 0; i < nq; ++i) {
        sum[i] = softmax_row(scores + i * pad, masks[i], n_keys, scale);
    }
    const bool from_rows = nq <= QUERIES;  // one group of queries: V dequantized in registers
    for (int64_t kb = 0; kb < n_keys; kb += KEY_BLOCK) {
        const int64_t nk = std::min(KEY_BLOCK, n_keys - kb);
        if (!from_rows) dequantize_rows(v_rows + kb * v_row_bytes, v_row_bytes, nk, dv, vrows);
        for (int64_t i = 0; i < nq; i += QUERIES) {
            float * a[QUERIES];
            const float * p[QUERIES];
            const int n = (int)std::min<int64_t>(QUERIES, nq - i);
            for (int q = 0; q < n; ++q) {
                a[q] = acc + (i + q) * dv;
                p[q] = scores + (i + q) * pad + kb;
            }
            if (from_rows) accumulate_group<true>(n, a, p, v_rows + kb * v_row_bytes, v_row_bytes, nk, dv);
            else accumulate_group<false>(n, a, p, (const char *)vrows, 0, nk, dv);
        }
    }
}

#else  // no AVX-512: attn_hook.cpp keeps the stock order

bool two_pass_supported(int64_t) {
    return false;
}

void attend_two_pass(const char *, size_t, const char *, size_t, int64_t, const char *, size_t, int64_t, int64_t, int64_t,
                     float, const ggml_fp16_t * const *, float *, float *, float *, float *) {}

#endif

}  // namespace specserve
