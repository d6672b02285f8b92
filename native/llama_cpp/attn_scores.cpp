// specserve: attention scores with the queries in SIMD lanes (attn_scores.h says why and in
// which order).
#include "attn_scores.h"

#include "q8_lanes.h"
#include "q8_matmul.h"

#include <math.h>
#include <string.h>

#include <algorithm>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__F16C__)
#include <immintrin.h>
#define SPECSERVE_SCORES_SIMD 1
#endif

namespace {

constexpr int LANES = 16;                      // queries a group: the int32 lanes of a register
constexpr int SLICES = SPECSERVE_QK8_0 / 4;   // 4-byte slices a block

inline const specserve_block_q8_0 * block(const void * rows, size_t row_bytes, int64_t r, int64_t b) {
    return (const specserve_block_q8_0 *)((const char *)rows + r * row_bytes) + b;
}

}  // namespace

extern "C" void specserve_attn_scores_ref(const void * k_rows, size_t k_row_bytes, int64_t n_keys, const void * q8,
                                          size_t q_row, int64_t nq, int64_t nb, float * scores, size_t pad) {
    // the lanes matmul's own specification, the keys as its weight rows (the scale product
    // commutes, so it is the same score)
    specserve_q8_lanes_ref(k_rows, k_row_bytes, n_keys, q8, q_row, nq, nb, scores, pad);
    for (int64_t i = 0; i < nq; ++i) {
        for (size_t k = (size_t)n_keys; k < pad; ++k) scores[i * pad + k] = 0.0f;
    }
}

#ifdef SPECSERVE_SCORES_SIMD

namespace {

constexpr int KEYS = 4;  // keys whose chains advance together (slice-major, as the matmul's tile)
// Key rows fetched this far ahead of the copy below (specserve_prefetch_row): unfetched, 40% of
// this function's time was the first load of a row (2-core AMX Xeon, decoding at 256 cached).
constexpr int64_t KEYS_AHEAD = 32;

struct Scratch {
    std::vector<uint8_t> keys;   // [key][block][32]: the keys' quants + 128
    std::vector<uint16_t> kh;    // [key][block]: their half scales
    std::vector<float> kd;       // the same in fp32
    std::vector<int32_t> q;      // [block][slice][lane]: a group's queries, 4 bytes a lane
    std::vector<float> qd;       // [block][lane]
    std::vector<int32_t> corr;   // [block][lane]: -128 x the query block's quant sum
};

// A group's queries in lanes, as key_tile reads them.
struct Group {
    int32_t * q;     // [block][slice][lane]: 4 bytes of a query a lane
    float * qd;      // [block][lane]
    int32_t * corr;  // [block][lane]: -128 x the query block's quant sum
};

// A group's queries into lanes (lanes past nq: zero quants and scale, so their scores are 0).
void lay_out_queries(const void * q8, size_t q_row, int64_t i0, int64_t n, int64_t nb, const Group & sc) {
    for (int64_t b = 0; b < nb; ++b) {
        for (int l = 0; l < LANES; ++l) {
            int32_t sum = 0;
            float d = 0.0f;
            int32_t w[SLICES] = {0};
            if (l < n) {
                const specserve_block_q8_0 * qb = block(q8, q_row, i0 + l, b);
                memcpy(w, qb->qs, sizeof w);
                for (int j = 0; j < SPECSERVE_QK8_0; ++j) sum += qb->qs[j];
                d = specserve_half_to_float(qb->d);
            }
            for (int s = 0; s < SLICES; ++s) sc.q[(b * SLICES + s) * LANES + l] = w[s];
            sc.qd[b * LANES + l] = d;
            sc.corr[b * LANES + l] = -128 * sum;
        }
    }
}

// KU keys' scores against the group's 16 queries: out[u] holds key u's 16 scores.
template <int KU>
inline void key_tile(const uint8_t * keys, const float * kd, int64_t nb, const Group & sc, __m512 * out) {
    __m512 acc[KU];
    for (int u = 0; u < KU; ++u) acc[u] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) {
        const __m512i corr = _mm512_loadu_si512(sc.corr + b * LANES);
        __m512i s0[KU], s1[KU];
        for (int u = 0; u < KU; ++u) { s0[u] = corr; s1[u] = _mm512_setzero_si512(); }
        const int32_t * qs = sc.q + b * SLICES * LANES;
#pragma GCC unroll 8
        for (int s = 0; s < SLICES; ++s) {
            const __m512i q = _mm512_loadu_si512(qs + s * LANES);
#pragma GCC unroll 8
            for (int u = 0; u < KU; ++u) {
                const int32_t * k = (const int32_t *)(keys + (u * nb + b) * SPECSERVE_QK8_0);
                __m512i & chain = (s & 1) ? s1[u] : s0[u];  // two chains a key: half the latency
                chain = _mm512_dpbusd_epi32(chain, _mm512_set1_epi32(k[s]), q);
            }
        }
        const __m512 qd = _mm512_loadu_ps(sc.qd + b * LANES);
#pragma GCC unroll 8
        for (int u = 0; u < KU; ++u) {
            const __m512 d = _mm512_mul_ps(qd, _mm512_set1_ps(kd[u * nb + b]));
            acc[u] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_add_epi32(s0[u], s1[u])), acc[u]);
        }
    }
    for (int u = 0; u < KU; ++u) out[u] = acc[u];
}

// 16 x 16 floats: rows[j] lane l -> cols[l] lane j.
inline void transpose16(const __m512 * rows, __m512 * cols) {
    __m512 t[16], r[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(rows[i], rows[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(rows[i], rows[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xee);
        r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xee);
    }
    for (int i = 0; i < 4; ++i) {  // 128-bit chunks: rows 0-3 / 4-7 / 8-11 / 12-15
        t[i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
        t[i + 4] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xdd);
        t[i + 8] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0x88);
        t[i + 12] = _mm512_shuffle_f32x4(r[i + 8], r[i + 12], 0xdd);
    }
    for (int i = 0; i < 4; ++i) {
        cols[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
        cols[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
        cols[i + 4] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0x88);
        cols[i + 12] = _mm512_shuffle_f32x4(t[i + 4], t[i + 12], 0xdd);
    }
}

}  // namespace

extern "C" void specserve_attn_scores(const void * k_rows, size_t k_row_bytes, int64_t n_keys, const void * q8,
                                      size_t q_row, int64_t nq, int64_t nb, float * scores, size_t pad) {
    static thread_local Scratch scratch;
    Scratch & sc = scratch;  // one TLS lookup
    const int64_t padded = (n_keys + LANES - 1) / LANES * LANES;
    sc.keys.resize(padded * nb * SPECSERVE_QK8_0);
    sc.kh.resize(padded * nb + LANES);
    sc.kd.resize(padded * nb + LANES);
    sc.q.resize(nb * SLICES * LANES);
    sc.qd.resize(nb * LANES);
    sc.corr.resize(nb * LANES);
    uint8_t * const keys = sc.keys.data();  // raw pointers: the thread_local would be looked up again after every store
    uint16_t * const kh = sc.kh.data();
    float * const kd = sc.kd.data();
    const Group group{sc.q.data(), sc.qd.data(), sc.corr.data()};
    // the keys offset into unsigned bytes, once for every group of queries (past n_keys: zeros)
    const __m256i offset = _mm256_set1_epi8((char)0x80);
    for (int64_t k = 0; k < std::min<int64_t>(KEYS_AHEAD, n_keys); ++k) {  // the first rows
        specserve_prefetch_row((const char *)k_rows + k * k_row_bytes, nb);
    }
    for (int64_t k = 0; k < padded; ++k) {
        if (k + KEYS_AHEAD < n_keys) {
            specserve_prefetch_row((const char *)k_rows + (k + KEYS_AHEAD) * k_row_bytes, nb);
        }
        for (int64_t b = 0; b < nb; ++b) {
            uint8_t * out = keys + (k * nb + b) * SPECSERVE_QK8_0;
            if (k < n_keys) {
                const specserve_block_q8_0 * kb = block(k_rows, k_row_bytes, k, b);
                _mm256_storeu_si256((__m256i *)out, _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)kb->qs), offset));
                kh[k * nb + b] = kb->d;
            } else {
                memset(out, 0x80, SPECSERVE_QK8_0);
                kh[k * nb + b] = 0;
            }
        }
    }
    for (int64_t i = 0; i < padded * nb; i += LANES) {  // 16 scales a convert
        _mm512_storeu_ps(kd + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kh + i))));
    }
    for (int64_t i0 = 0; i0 < nq; i0 += LANES) {
        const int64_t n = nq - i0 < LANES ? nq - i0 : LANES;
        lay_out_queries(q8, q_row, i0, n, nb, group);
        for (int64_t k0 = 0; k0 < padded; k0 += LANES) {
            __m512 rows[LANES], cols[LANES];
            for (int u = 0; u < LANES; u += KEYS) {
                const int64_t k = k0 + u;
                key_tile<KEYS>(keys + k * nb * SPECSERVE_QK8_0, kd + k * nb, nb, group, rows + u);
            }
            transpose16(rows, cols);
            for (int64_t l = 0; l < n; ++l) _mm512_storeu_ps(scores + (i0 + l) * pad + k0, cols[l]);
        }
        for (int64_t l = 0; l < n; ++l) {
            for (size_t k = (size_t)padded; k < pad; ++k) scores[(i0 + l) * pad + k] = 0.0f;
        }
    }
}

extern "C" int specserve_attn_scores_compiled(void) { return 1; }

#else

extern "C" void specserve_attn_scores(const void * k_rows, size_t k_row_bytes, int64_t n_keys, const void * q8,
                                      size_t q_row, int64_t nq, int64_t nb, float * scores, size_t pad) {
    specserve_attn_scores_ref(k_rows, k_row_bytes, n_keys, q8, q_row, nq, nb, scores, pad);
}

extern "C" int specserve_attn_scores_compiled(void) { return 0; }

#endif
