// specserve: llama.cpp's CPU flash attention over a Q8_0 KV cache, with the queries that share
// a KV head taken together. patches/ggml-cpu.patch calls it first in
// ggml_compute_forward_flash_attn_ext_f16 (ops.cpp); it returns false for anything but Q8_0 K and
// V without ALiBi, soft-capping or sinks, and then the stock code runs.
//
// The stock kernel (ggml_compute_forward_flash_attn_ext_f16_one_chunk) walks the keys once per
// query row and head: for each key a Q8_0 dot product, an online-softmax update and a V row
// dequantized and added. A verification step of t tokens, or a batch of decoding sequences,
// repeats that walk for every query (t rows x 3 query heads per KV head for SmolLM2). Here one
// walk serves all queries of a KV head, a block of 64 keys at a time: the block's scores come from
// one Q8_0 matmul (q8_matmul.h: each score bit-identical to ggml's vec_dot), its V rows are
// dequantized once (with AVX2: ggml-base's dequantize_row_q8_0 is built for plain x86-64); then
// the queries' online softmax runs over the block 8 queries at a time, one per SIMD lane (expf on 8
// lanes at once, glibc's expf bit for bit: expf8.h), and last the accumulators take
// the block's V rows with 32 floats of two queries held in registers (the stock loop loads and
// stores its whole accumulator for every key).
// Every query's own sequence of operations is the stock one, in the same order -- the same
// score, `s*scale + mask`, the same expf calls, the same ggml_vec_scale_f32 / ggml_vec_mad_f32
// (vec.h) on its accumulator -- so its output is bit-identical to the stock kernel's, whatever
// else shares the step. Queries are independent: how they are grouped and which thread takes
// them changes no bit.
// Where the rows-in-lanes matmul serves the model (q8_lanes.h: no stock bit is kept anyway), a
// unit's queries take three passes over their keys instead (attn_two_pass.h), again in an order
// that depends on nothing but the query and its keys.
#include "ggml-cpu-impl.h"
#include "ggml-cpu.h"
#include "attn_two_pass.h"
#include "expf8.h"
#include "ggml-impl.h"
#include "q8_matmul.h"
#include "specserve.h"
#include "vec.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

std::atomic<long long> calls{0};  // attention ops this process ran here (tests: the model goes through it)

constexpr int64_t KEY_BLOCK = 64;   // keys scored per matmul
constexpr int64_t MAX_QUERIES = 96; // queries a unit (32 rows x 3 heads): scratch stays in L2

// One V row of Q8_0 blocks to floats: y = float(q) * fp32(d), as ggml's dequantize_row_q8_0 (ggml-base
// is built for any x86-64, so its loop is SSE2; the product is exact to the same one rounding).
inline void dequantize_q8_0(const void * x, float * y, int64_t n) {
    const auto * blk = (const specserve_block_q8_0 *) x;
    for (int64_t b = 0; b < n / SPECSERVE_QK8_0; ++b) {
        const float d = GGML_CPU_FP16_TO_FP32(blk[b].d);
#if defined(__AVX2__)
        const __m256 dv = _mm256_set1_ps(d);
        for (int j = 0; j < SPECSERVE_QK8_0; j += 8) {
            const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *) (blk[b].qs + j)));
            _mm256_storeu_ps(y + b * SPECSERVE_QK8_0 + j, _mm256_mul_ps(_mm256_cvtepi32_ps(q), dv));
        }
#else
        for (int j = 0; j < SPECSERVE_QK8_0; ++j) {
            y[b * SPECSERVE_QK8_0 + j] = blk[b].qs[j] * d;
        }
#endif
    }
}

// Queries' softmax state is worked LANES at a time (softmax_lanes); ms/vs of the queries i0..i0+7 are
// stored key by key, [key][lane]: query i's factor for key j is at lane_at(i) + j * LANES
constexpr int64_t LANES = 8;

inline int64_t lane_at(int64_t i) {
    return (i / LANES) * LANES * KEY_BLOCK + i % LANES;
}

// vs of a key the query must not see (its mask is -inf): no update at all
constexpr float SKIP = -1.0f;

// Two queries' accumulators (32 floats each, from a and b) through a block of nk keys: per key,
// acc *= ms (when ms != 1) then acc = fma(v, vs, acc) -- ggml_vec_scale_f32 and ggml_vec_mad_f32
// on these 32 floats, kept in 8 registers instead of memory. `same`: b is a (an odd query out).
inline void accumulate(float * a, float * b, const float * v, int64_t v_stride, int64_t nk,
                       const float * ms_a, const float * vs_a, const float * ms_b, const float * vs_b, bool same) {
    // ms/vs of one query: every LANES-th float (softmax_lanes' layout)
    __m256 x0 = _mm256_loadu_ps(a), x1 = _mm256_loadu_ps(a + 8), x2 = _mm256_loadu_ps(a + 16), x3 = _mm256_loadu_ps(a + 24);
    __m256 y0 = _mm256_loadu_ps(b), y1 = _mm256_loadu_ps(b + 8), y2 = _mm256_loadu_ps(b + 16), y3 = _mm256_loadu_ps(b + 24);
    for (int64_t j = 0; j < nk; ++j, v += v_stride) {
        if (vs_a[j * LANES] != SKIP) {
            if (ms_a[j * LANES] != 1.0f) {
                const __m256 m = _mm256_set1_ps(ms_a[j * LANES]);
                x0 = _mm256_mul_ps(x0, m); x1 = _mm256_mul_ps(x1, m); x2 = _mm256_mul_ps(x2, m); x3 = _mm256_mul_ps(x3, m);
            }
            const __m256 w = _mm256_set1_ps(vs_a[j * LANES]);
            x0 = _mm256_fmadd_ps(_mm256_loadu_ps(v), w, x0);
            x1 = _mm256_fmadd_ps(_mm256_loadu_ps(v + 8), w, x1);
            x2 = _mm256_fmadd_ps(_mm256_loadu_ps(v + 16), w, x2);
            x3 = _mm256_fmadd_ps(_mm256_loadu_ps(v + 24), w, x3);
        }
        if (!same && vs_b[j * LANES] != SKIP) {
            if (ms_b[j * LANES] != 1.0f) {
                const __m256 m = _mm256_set1_ps(ms_b[j * LANES]);
                y0 = _mm256_mul_ps(y0, m); y1 = _mm256_mul_ps(y1, m); y2 = _mm256_mul_ps(y2, m); y3 = _mm256_mul_ps(y3, m);
            }
            const __m256 w = _mm256_set1_ps(vs_b[j * LANES]);
            y0 = _mm256_fmadd_ps(_mm256_loadu_ps(v), w, y0);
            y1 = _mm256_fmadd_ps(_mm256_loadu_ps(v + 8), w, y1);
            y2 = _mm256_fmadd_ps(_mm256_loadu_ps(v + 16), w, y2);
            y3 = _mm256_fmadd_ps(_mm256_loadu_ps(v + 24), w, y3);
        }
    }
    _mm256_storeu_ps(a, x0); _mm256_storeu_ps(a + 8, x1); _mm256_storeu_ps(a + 16, x2); _mm256_storeu_ps(a + 24, x3);
    if (!same) {
        _mm256_storeu_ps(b, y0); _mm256_storeu_ps(b + 8, y1); _mm256_storeu_ps(b + 16, y2); _mm256_storeu_ps(b + 24, y3);
    }
}


// The online softmax of `lanes` (<= 8) queries over a block of nk keys, each lane one query's stock
// sequence: s = score*scale + mask; a key it may not see (mask -inf) changes nothing (ms 1, vs SKIP);
// s > max: ms = expf(max - s), vs = 1, max = s; else ms = 1, vs = expf(s - max); sum = fma(sum, ms, vs).
// scores: the queries' rows (KEY_BLOCK apart); masks: their mask rows (or null); m, sum: their max and
// sum, updated; ms, vs: [key][lane] (see lane_at).
inline void softmax_lanes(const float * scores, const ggml_fp16_t * const * masks, int64_t kb, int64_t nk,
                          int lanes, float scale, float * m, float * sum, float * ms_out, float * vs_out, bool vector_exp) {
    alignas(32) float m0[LANES], s0[LANES];
    for (int l = 0; l < LANES; ++l) {
        const bool real = l < lanes;
        m0[l] = real ? m[l] : -INFINITY;
        s0[l] = real ? sum[l] : 0.0f;
    }
    // the lanes' scores and mask values key by key, [key][lane] (a lane past the queries sees no
    // key): transposed here, read as vectors below (8 scalar stores just before a vector load would
    // stall it)
    alignas(32) float sv[KEY_BLOCK * LANES], mv[KEY_BLOCK * LANES];
    for (int l = 0; l < LANES; ++l) {
        const ggml_fp16_t * row = l < lanes ? masks[l] : nullptr;
        const float * score = scores + (l < lanes ? l : 0) * KEY_BLOCK;
        for (int64_t j = 0; j < nk; ++j) {
            sv[j * LANES + l] = score[j];
            mv[j * LANES + l] = l >= lanes ? -INFINITY : row ? GGML_CPU_FP16_TO_FP32(row[kb + j]) : 0.0f;
        }
    }
    __m256 mx = _mm256_load_ps(m0), sx = _mm256_load_ps(s0);
    const __m256 ninf = _mm256_set1_ps(-INFINITY), one = _mm256_set1_ps(1.0f), skip = _mm256_set1_ps(SKIP);
    const __m256 scale8 = _mm256_set1_ps(scale);
    alignas(32) float arg[LANES], e[LANES];
    for (int64_t j = 0; j < nk; ++j) {
        const __m256 mask = _mm256_load_ps(mv + j * LANES);
        // fused with the add or not: the mask is 0 or -inf, the latter skipped (so are the lanes past
        // the queries, whatever their scores hold)
        const __m256 s = _mm256_add_ps(_mm256_mul_ps(_mm256_load_ps(sv + j * LANES), scale8), mask);
        const __m256 hidden = _mm256_cmp_ps(mask, ninf, _CMP_EQ_OQ);
        const __m256 raised = _mm256_cmp_ps(s, mx, _CMP_GT_OQ);  // false where hidden: -inf > max never holds
        const __m256 x = _mm256_blendv_ps(_mm256_sub_ps(s, mx), _mm256_sub_ps(mx, s), raised);
        mx = _mm256_blendv_ps(mx, s, raised);
        __m256 ex;
        if (vector_exp) {
            ex = specserve::expf8(x);
        } else {
            _mm256_store_ps(arg, x);
            for (int l = 0; l < LANES; ++l) {
                e[l] = expf(arg[l]);
            }
            ex = _mm256_load_ps(e);
        }
        const __m256 ms = _mm256_blendv_ps(_mm256_blendv_ps(one, ex, raised), one, hidden);
        const __m256 vs = _mm256_blendv_ps(_mm256_blendv_ps(ex, one, raised), skip, hidden);
        sx = _mm256_blendv_ps(_mm256_fmadd_ps(sx, ms, vs), sx, hidden);
        _mm256_storeu_ps(ms_out + j * LANES, ms);
        _mm256_storeu_ps(vs_out + j * LANES, vs);
    }
    _mm256_store_ps(m0, mx);
    _mm256_store_ps(s0, sx);
    for (int l = 0; l < lanes; ++l) {
        m[l] = m0[l];
        sum[l] = s0[l];
    }
}

struct Scratch {
    std::vector<char> q8;      // the unit's queries as Q8_0 rows
    std::vector<float> scores; // [query][key in block]
    std::vector<float> acc;    // [query][DV]: each query's VKQ accumulator
    std::vector<float> vrows;  // the key block's V rows dequantized, [key][DV]
    std::vector<float> ms, vs; // [query][key in block]: scale of the accumulator, weight of V
    std::vector<float> m, s;   // each query's running max and sum
    std::vector<const ggml_fp16_t *> mask;  // each query's mask row
};

}  // namespace

long long specserve_attn_q8_0_calls(void) {
    return calls.load(std::memory_order_relaxed);
}

// One past the last key in [floor, end) that the mask row does not hide (-inf), else floor. The
// hidden tail is the KV view's padding and, per stream, the cells past the sequence: hundreds of
// halves a query, which a scalar loop walked one conversion and compare at a time (~0.6 CPU-ms
// of a verification step of 8 tokens at 256 cached). A half is -inf exactly when its bits are
// 0xfc00, so 16 of them are compared at once.
inline int64_t last_visible(const ggml_fp16_t * mp, int64_t end, int64_t floor) {
    int64_t k = end;
#if defined(__AVX2__)
    const __m256i ninf = _mm256_set1_epi16((short) 0xfc00);
    for (; k - 16 >= floor; k -= 16) {
        const __m256i h = _mm256_loadu_si256((const __m256i *) (mp + k - 16));
        const unsigned hidden = (unsigned) _mm256_movemask_epi8(_mm256_cmpeq_epi16(h, ninf));
        if (hidden != 0xffffffffu) {  // the highest visible half: two mask bits a half
            return k - 16 + (31 - __builtin_clz(~hidden)) / 2 + 1;
        }
    }
#endif
    while (k > floor && GGML_CPU_FP16_TO_FP32(mp[k - 1]) == -INFINITY) {
        --k;
    }
    return k;
}

bool specserve_flash_attn_q8_0(const struct ggml_compute_params * params, struct ggml_tensor * dst) {
    const ggml_tensor * q = dst->src[0];
    const ggml_tensor * k = dst->src[1];
    const ggml_tensor * v = dst->src[2];
    const ggml_tensor * mask = dst->src[3];
#if !defined(__AVX2__) || !defined(__FMA__)
    return false;  // the accumulators' registers below are AVX2 (the matmul's hook stands aside there too)
#endif
    if (params->use_ref || !specserve_q8_0_enabled() || dst->src[4] != nullptr) {
        return false;
    }
    if (k->type != GGML_TYPE_Q8_0 || v->type != GGML_TYPE_Q8_0 || q->type != GGML_TYPE_F32 ||
        (mask && mask->type != GGML_TYPE_F16)) {
        return false;
    }
    float scale, max_bias, softcap;
    memcpy(&scale, (const float *) dst->op_params + 0, sizeof(float));
    memcpy(&max_bias, (const float *) dst->op_params + 1, sizeof(float));
    memcpy(&softcap, (const float *) dst->op_params + 2, sizeof(float));
    if (max_bias != 0.0f || softcap != 0.0f) {
        return false;
    }
    GGML_TENSOR_LOCALS(int64_t, neq, q, ne)
    GGML_TENSOR_LOCALS(size_t, nbq, q, nb)
    GGML_TENSOR_LOCALS(int64_t, nek, k, ne)
    GGML_TENSOR_LOCALS(size_t, nbk, k, nb)
    GGML_TENSOR_LOCALS(int64_t, nev, v, ne)
    GGML_TENSOR_LOCALS(size_t, nbv, v, nb)
    GGML_TENSOR_LOCALS(int64_t, ne, dst, ne)
    GGML_TENSOR_LOCALS(size_t, nb, dst, nb)
    const int64_t DK = nek0, DV = nev0, N = neq1;
    if (DK % SPECSERVE_QK8_0 != 0 || DV % SPECSERVE_QK8_0 != 0 || neq0 != DK || nek2 != nev2 || neq2 % nek2 != 0 || neq3 != nek3 ||
        nek3 != nev3 || nek1 != nev1 || nbq0 != sizeof(float) || nb0 != sizeof(float)) {
        return false;
    }
    const int64_t heads_per_kv = neq2 / nek2;

    // Units of work: (sequence stream, KV head, query rows), every query head of the KV head in
    // one unit, rows split only to keep a unit within MAX_QUERIES. A unit's cost is mostly its walk
    // over the keys (scores, V rows dequantized, the softmax's lanes), hardly its queries: splitting
    // a few queries into more units to share them between threads (one unit per query head when
    // decoding one or two sequences, per 3 rows of a verification) made each thread walk the keys
    // more often. One unit per KV head instead (2 cores, AVX2, B = 1, 1,024 cached: t = 1 18.2 /
    // 19.1 -> 14.4 / 16.9 ms a step; B = 2 24.8 / 29.1 -> 18.4 / 21.1; docs/results.md).
    const int nth = params->nth;
    const int64_t groups = neq3 * nek2;
    const int64_t heads_per_unit = heads_per_kv;
    const int64_t chunks = (N * heads_per_unit + MAX_QUERIES - 1) / MAX_QUERIES;  // a KV head's units at least
    const bool two_pass = specserve_q8_lanes_enabled() && specserve::two_pass_supported(DV);
    // In three passes a unit's cost is its queries' scores and V sums, hardly its walk, so units
    // should divide evenly between threads: 3 KV heads on 2 threads took 2:1, one thread idle a
    // third of the op; verifying 8 tokens, rows split in two make 6 units, 3:3.
    const int64_t min_split = two_pass ? std::min<int64_t>(N, (2 * nth + groups - 1) / groups) : 1;
    const int64_t rows_per_unit = (N + std::max(chunks, min_split) - 1) / std::max(chunks, min_split);  // rows shared evenly
    const int64_t row_split = (N + rows_per_unit - 1) / rows_per_unit;
    const int64_t units = groups * row_split;

    const ggml_from_float_t quantize = ggml_get_type_traits_cpu(GGML_TYPE_Q8_0)->from_float;
    const size_t q_row = ggml_row_size(GGML_TYPE_Q8_0, DK);
    const int64_t nb_dk = DK / SPECSERVE_QK8_0;

    static thread_local Scratch scratch;
    Scratch & sc = scratch;  // one TLS lookup (a shared library's thread_local costs a call each time)
    const int64_t qmax = heads_per_unit * rows_per_unit;
    const int64_t qlanes = (qmax + LANES - 1) / LANES * LANES;  // softmax_lanes stores ms/vs of whole groups of 8
    sc.q8.resize(qmax * q_row);
    sc.scores.resize(qmax * KEY_BLOCK);
    sc.acc.resize(qmax * DV);
    sc.vrows.resize(KEY_BLOCK * DV);
    sc.ms.resize(qlanes * KEY_BLOCK);
    sc.vs.resize(qlanes * KEY_BLOCK);
    sc.m.resize(qmax);
    sc.s.resize(qmax);
    sc.mask.resize(qmax);

    const bool vector_exp = specserve::expf8_matches_libm();
    if (two_pass) {  // every query's whole row of scores
        sc.scores.resize(qmax * ((nek1 + 15) / 16 * 16));
    }
    if (params->ith == 0) {
        ggml_threadpool_chunk_set(params->threadpool, nth);
        calls.fetch_add(1, std::memory_order_relaxed);
    }
    ggml_barrier(params->threadpool);

    // A thread claims a whole sequence's units at a time once there are sequences enough to share
    // evenly: its KV heads' rows are one row of the cache each, so the second and third heads find
    // them in this core's L2 (claimed one by one, the two threads each read every row from memory).
    const int64_t per_claim = neq3 >= 4 * nth ? nek2 * row_split : 1;
    for (int64_t claim = params->ith; claim < units / per_claim; claim = ggml_threadpool_chunk_add(params->threadpool, 1))
    for (int64_t unit = claim * per_claim; unit < (claim + 1) * per_claim; ++unit) {
        const int64_t rc = unit % row_split, g = unit / row_split;
        const int64_t iq3 = g / nek2, ik2 = g % nek2;
        const int64_t h0 = ik2 * heads_per_kv;
        const int64_t r0 = rc * rows_per_unit, nr = std::min(N, r0 + rows_per_unit) - r0;
        const int64_t nq = heads_per_unit * nr;  // query i: head h0 + i / nr, row r0 + i % nr

        int64_t n_keys = 0;  // keys past the last one any query may see are skipped
        for (int64_t i = 0; i < nq; ++i) {
            const int64_t iq2 = h0 + i / nr, iq1 = r0 + i % nr;
            quantize((const float *) ((const char *) q->data + iq1 * nbq1 + iq2 * nbq2 + iq3 * nbq3),
                     sc.q8.data() + i * q_row, DK);
            sc.m[i] = -INFINITY;
            sc.s[i] = 0.0f;
            std::fill(sc.acc.begin() + i * DV, sc.acc.begin() + (i + 1) * DV, 0.0f);
            const ggml_fp16_t * mp = mask ? (const ggml_fp16_t *) ((const char *) mask->data + iq1 * mask->nb[1] +
                                                                   (iq2 % mask->ne[2]) * mask->nb[2] +
                                                                   (iq3 % mask->ne[3]) * mask->nb[3])
                                          : nullptr;
            sc.mask[i] = mp;
            // the query heads of a row share its mask row: scanned once
            const int64_t last = !mp ? nek1 : i >= nr && sc.mask[i - nr] == mp ? n_keys : last_visible(mp, nek1, n_keys);
            n_keys = std::max(n_keys, last);
        }

        float * scores = sc.scores.data();
        float * m = sc.m.data();
        float * sum = sc.s.data();
        float * vrows = sc.vrows.data();
        float * ms_all = sc.ms.data();
        float * vs_all = sc.vs.data();
        float * acc_all = sc.acc.data();
        const ggml_fp16_t * const * masks = sc.mask.data();
        const char * k_base = (const char *) k->data + ik2 * nbk2 + iq3 * nbk3;
        const char * v_base = (const char *) v->data + ik2 * nbv2 + iq3 * nbv3;
        if (two_pass) {
            specserve::attend_two_pass(k_base, nbk1, v_base, nbv1, n_keys, sc.q8.data(), q_row, nq, nb_dk, DV, scale,
                                       masks, scores, vrows, acc_all, sum);
        }
        for (int64_t kb = 0; kb < (two_pass ? 0 : n_keys); kb += KEY_BLOCK) {
            const int64_t nk = std::min(KEY_BLOCK, n_keys - kb);
            // scores[i][j] = dot(key kb + j, query i): ggml's vec_dot_q8_0_q8_0, bit for bit
            specserve_q8_0_matmul(k_base + kb * nbk1, nbk1, nk, sc.q8.data(), q_row, nq, nb_dk, scores, KEY_BLOCK);
            // the cache is cold (read once a step, after the weights went through): the next
            // block's keys and V rows are fetched while this block's V rows are dequantized
            for (int64_t j = 0; j < nk; ++j) {
                if (kb + KEY_BLOCK + j < n_keys) {
                    specserve_prefetch_row(k_base + (kb + KEY_BLOCK + j) * nbk1, nb_dk);
                    specserve_prefetch_row(v_base + (kb + KEY_BLOCK + j) * nbv1, DV / SPECSERVE_QK8_0);
                }
                dequantize_q8_0(v_base + (kb + j) * nbv1, vrows + j * DV, DV);
            }
            // 1. each query's online softmax over the block, in key order, as the stock loop: the
            //    factor its accumulator is scaled by (ms) and V's weight (vs) per key. Eight queries
            //    at a time, one per lane: every lane runs its own query's stock sequence (the same
            //    compares, the same expf -- 8 at a time where expf8 is proven to be this libm's:
            //    expf8.h -- the same fma), so the lanes change no bit, and the serial chain of
            //    each query's max and sum runs beside seven others instead of alone.
            for (int64_t i0 = 0; i0 < nq; i0 += LANES) {
                softmax_lanes(scores + i0 * KEY_BLOCK, masks + i0, kb, nk, (int) std::min(LANES, nq - i0), scale,
                              m + i0, sum + i0, ms_all + i0 * KEY_BLOCK, vs_all + i0 * KEY_BLOCK, vector_exp);
            }
            // 2. the accumulators, 32 floats at a time in registers for two queries, take the same
            //    products in the same order as ggml_vec_scale_f32 / ggml_vec_mad_f32 would (a
            //    scale by 1.0 is the identity and is left out)
            for (int64_t i = 0; i < nq; i += 2) {
                const int64_t i1 = std::min(i + 1, nq - 1);  // an odd last query runs beside itself
                for (int64_t h = 0; h < DV; h += 32) {
                    accumulate(acc_all + i * DV + h, acc_all + i1 * DV + h, vrows + h, DV, nk,
                               ms_all + lane_at(i), vs_all + lane_at(i), ms_all + lane_at(i1), vs_all + lane_at(i1), i1 == i);
                }
            }
        }
        for (int64_t i = 0; i < nq; ++i) {
            const int64_t iq2 = h0 + i / nr, iq1 = r0 + i % nr;
            float * acc = sc.acc.data() + i * DV;
            const float s_inv = sc.s[i] == 0.0f ? 0.0f : 1.0f / sc.s[i];
            ggml_vec_scale_f32(DV, acc, s_inv);
            memcpy((char *) dst->data + (iq3 * ne2 * ne1 + iq2 + iq1 * ne1) * nb1, acc, nb1);
        }
    }
    return true;
}
