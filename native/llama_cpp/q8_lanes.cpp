// specserve's rows-in-lanes Q8_0 matmul: see q8_lanes.h for the layout and the arithmetic.
#include "q8_lanes.h"

#include <math.h>
#include <string.h>

#include <type_traits>

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__F16C__)
#include <immintrin.h>
#define SPECSERVE_LANES_SIMD 1
#endif

namespace {

constexpr int SLICES = SPECSERVE_QK8_0 / 4;               // 4-byte slices a block: 8
constexpr size_t QREC = SPECSERVE_LANES * SPECSERVE_QK8_0;  // quant bytes a group and block: 512
constexpr size_t DREC = SPECSERVE_LANES * 2;               // half scales a group and block: 32
constexpr size_t AREC = 48;                                 // activation bytes a row and block

struct act_record {         // one activation row's block, as the kernel reads it
    int8_t  qs[SPECSERVE_QK8_0];
    int32_t negcorr;        // -128 x sum(qs): sum((w + 128) a) + negcorr = sum(w a)
    float   d;              // fp32 of the block's half scale
    int32_t pad[2];         // 48 bytes: 16-byte aligned, so no slice straddles a cache line
};
static_assert(sizeof(act_record) == AREC, "activation record");

inline const specserve_block_q8_0 * block(const void * rows, size_t row_bytes, int64_t r, int64_t b) {
    return (const specserve_block_q8_0 *)((const char *)rows + r * row_bytes) + b;
}

// The activation layout (q8_lanes.h): rows in tiles of TILE, each tile's records block-major,
// [tile][block][row in tile], so a tile's blocks follow each other in memory.
constexpr int64_t TILE = 8;

inline int64_t tile_width(int64_t tile, int64_t n_a) {
    return n_a - tile * TILE < TILE ? n_a - tile * TILE : TILE;
}

inline int64_t record_at(int64_t c, int64_t b, int64_t n_a, int64_t nb) {
    const int64_t tile = c / TILE;
    return tile * TILE * nb + b * tile_width(tile, n_a) + c % TILE;
}

}  // namespace

extern "C" size_t specserve_q8_lanes_size(int64_t n_w, int64_t nb) {
    return (size_t)(n_w / SPECSERVE_LANES) * nb * (QREC + DREC);
}

extern "C" void specserve_q8_lanes_pack(const void * w, size_t w_row_bytes, int64_t n_w, int64_t nb, void * out) {
    for (int64_t g = 0; g < n_w / SPECSERVE_LANES; ++g) {
        uint8_t * q = (uint8_t *)out + g * nb * (QREC + DREC);
        uint16_t * d = (uint16_t *)(q + nb * QREC);
        for (int64_t b = 0; b < nb; ++b) {
            for (int l = 0; l < SPECSERVE_LANES; ++l) {
                const specserve_block_q8_0 * blk = block(w, w_row_bytes, g * SPECSERVE_LANES + l, b);
                d[b * SPECSERVE_LANES + l] = blk->d;
                for (int s = 0; s < SLICES; ++s) {
                    for (int k = 0; k < 4; ++k) {  // slice s of lane l, offset to unsigned
                        q[b * QREC + s * 64 + l * 4 + k] = (uint8_t)(blk->qs[4 * s + k] ^ 0x80);
                    }
                }
            }
        }
    }
}

extern "C" size_t specserve_q8_lanes_act_size(int64_t n_a, int64_t nb) {
    return (size_t)n_a * nb * AREC;
}

extern "C" void specserve_q8_lanes_act(const void * a, size_t a_row_bytes, int64_t n_a, int64_t nb, void * out) {
    for (int64_t b = 0; b < nb; ++b) {
        for (int64_t c = 0; c < n_a; ++c) {
            act_record * rec = (act_record *)out + record_at(c, b, n_a, nb);
            const specserve_block_q8_0 * blk = block(a, a_row_bytes, c, b);
#ifdef SPECSERVE_LANES_SIMD
            const __m256i q = _mm256_loadu_si256((const __m256i *)blk->qs);
            _mm256_storeu_si256((__m256i *)rec->qs, q);
            // the quants' sum: pairs by maddubs against ones (exact in int16), then 16 int16 summed
            const __m256i pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(1), q);
            const __m256i quads = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
            __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(quads), _mm256_extracti128_si256(quads, 1));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
            s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
            const int32_t sum = _mm_cvtsi128_si32(s4);
            rec->d = _cvtsh_ss(blk->d);
#else
            memcpy(rec->qs, blk->qs, sizeof rec->qs);
            int32_t sum = 0;
            for (int i = 0; i < SPECSERVE_QK8_0; ++i) sum += blk->qs[i];
            rec->d = specserve_half_to_float(blk->d);
#endif
            rec->negcorr = -128 * sum;
            rec->pad[0] = rec->pad[1] = 0;
        }
    }
}

namespace {

// fp32 -> IEEE half, rounding to nearest even (F16C's _cvtss_sh(x, 0), which ggml's x86
// quantize_row_q8_0 uses), for the plain path; finite, non-negative inputs below 65520 only.
uint16_t float_to_half(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    const int32_t e = (int32_t)(x >> 23) - 127 + 15;
    uint32_t man = x & 0x7fffff;
    if (e <= 0) {  // subnormal half (or zero): shift the implicit bit in, round the rest off
        if (e < -10) return 0;
        man |= 0x800000;
        const int shift = 14 - e;
        uint32_t h = man >> shift, rest = man & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rest > half || (rest == half && (h & 1))) h++;
        return (uint16_t)h;
    }
    uint32_t h = (uint32_t)e << 10 | man >> 13, rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;  // a carry into the exponent is right
    return (uint16_t)h;
}

}  // namespace

extern "C" void specserve_q8_lanes_act_f32(const float * x, size_t x_row_bytes, int64_t n_a, int64_t nb, void * out) {
    act_record * rec = (act_record *)out;
    for (int64_t c = 0; c < n_a; ++c) {
        const float * row = (const float *)((const char *)x + c * x_row_bytes);
#ifdef SPECSERVE_LANES_SIMD
        // in passes over the row's blocks, so that each pass's blocks overlap in the core: the
        // maxima, then the scales (the divisions 16 blocks a vector), then the quants
        constexpr int64_t CHUNK = 64;
        float amax[CHUNK], id[CHUNK], d[CHUNK];
        for (int64_t b0 = 0; b0 < nb; b0 += CHUNK) {
            const int64_t n = nb - b0 < CHUNK ? nb - b0 : CHUNK;
            for (int64_t j = 0; j < n; ++j) {
                const float * v = row + (b0 + j) * SPECSERVE_QK8_0;
                amax[j] = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(v)), _mm512_abs_ps(_mm512_loadu_ps(v + 16))));
            }
            for (int64_t j = 0; j < n; ++j) {
                id[j] = amax[j] != 0.0f ? 127.0f / amax[j] : 0.0f;
                d[j] = amax[j] / 127.0f;
            }
            for (int64_t j = 0; j < n; ++j) {
                const float * v = row + (b0 + j) * SPECSERVE_QK8_0;
                act_record * r = rec + record_at(c, b0 + j, n_a, nb);
                r->d = _cvtsh_ss(_cvtss_sh(d[j], 0));
                // x * id rounded to nearest even (the default rounding), as _mm256_round_ps + cvt do
                const __m512i q0 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(v), _mm512_set1_ps(id[j])));
                const __m512i q1 = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(v + 16), _mm512_set1_ps(id[j])));
                _mm_storeu_si128((__m128i *)r->qs, _mm512_cvtsepi32_epi8(q0));
                _mm_storeu_si128((__m128i *)(r->qs + 16), _mm512_cvtsepi32_epi8(q1));
                r->negcorr = -128 * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
                r->pad[0] = r->pad[1] = 0;
            }
        }
#else
        for (int64_t b = 0; b < nb; ++b) {
            act_record * r = rec + record_at(c, b, n_a, nb);
            const float * v = row + b * SPECSERVE_QK8_0;
            float amax = 0.0f;
            for (int i = 0; i < SPECSERVE_QK8_0; ++i) amax = fmaxf(amax, fabsf(v[i]));
            const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
            r->d = specserve_half_to_float(float_to_half(amax / 127.0f));
            int32_t sum = 0;
            for (int i = 0; i < SPECSERVE_QK8_0; ++i) {
                const int32_t q = (int32_t)nearbyintf(v[i] * id);
                r->qs[i] = (int8_t)(q > 127 ? 127 : q < -128 ? -128 : q);
                sum += r->qs[i];
            }
            r->negcorr = -128 * sum;
            r->pad[0] = r->pad[1] = 0;
        }
#endif
    }
}

extern "C" void specserve_q8_lanes_ref(const void * w, size_t w_row_bytes, int64_t n_w,
                                       const void * a, size_t a_row_bytes, int64_t n_a,
                                       int64_t nb, float * dst, size_t dst_stride) {
    for (int64_t c = 0; c < n_a; ++c) {
        for (int64_t r = 0; r < n_w; ++r) {
            float acc = 0.0f;
            for (int64_t b = 0; b < nb; ++b) {
                const specserve_block_q8_0 * wb = block(w, w_row_bytes, r, b);
                const specserve_block_q8_0 * ab = block(a, a_row_bytes, c, b);
                int32_t q = 0;
                for (int i = 0; i < SPECSERVE_QK8_0; ++i) q += (int32_t)wb->qs[i] * ab->qs[i];
                const float d = specserve_half_to_float(wb->d) * specserve_half_to_float(ab->d);
                acc = fmaf(d, (float)q, acc);
            }
            dst[c * dst_stride + r] = acc;
        }
    }
}

#ifdef SPECSERVE_LANES_SIMD

namespace {

// One group of 16 weight rows against P activation rows. The vpdpbusd of a block go slice by
// slice across the rows (slice-major), so that the P rows' chains advance together: in row-major
// order the core's scheduler held only ~5 rows' dependent chains at a time and issued ~0.7
// vpdpbusd a cycle of its 2 (hot, 8 rows: 12.2 TSC cycles a group-block-row, now 7.9; cold, one
// thread, all the served model's matrices: 32 rows 50.1 -> 37.2 ms). With up to 4 rows each row's
// 8 dependent vpdpbusd are split into two chains besides (their int32 sum is exact, so the order
// of the adds does not matter): a block then waits ~20 cycles, not ~40, on the latency.
// How far ahead of the kernel the weights are fetched: a group of rows is one stream of bytes,
// groups follow each other, and the hardware's prefetchers alone leave the kernel waiting on
// memory with compute idle (one thread, served model's matrices, cold: 8 rows 22.2 ms without,
// 16.3 ms at 8 KiB ahead into L1). Into L2 far ahead (an L2 prefetch holds none of L1's few fill
// buffers, so many more lines are in flight) and into L1 just ahead: engine steps, 2 threads,
// a Sapphire Rapids Xeon, against 8 KiB into L1 alone (builds alternating, 6 rounds): 1 row
// 4.70 -> 4.53 ms, 8 rows 8.76 -> 7.99, 8 sequences x 1 row 11.58 -> 10.73.
// Past a buffer's end it fetches nothing harmful: a prefetch never faults.
constexpr size_t PREFETCH_L2 = 32768, PREFETCH_L1 = 2048;

// Block b of a group (q: its records, d: its half scales) into the P rows' accumulators.
template <int P>
inline void block_step(const uint8_t * q, const uint16_t * d, int64_t b, const act_record * r, __m512 * acc) {
    constexpr bool two_chains = P <= 4;
    __m512i w[SLICES];
#pragma GCC unroll 8
    for (int s = 0; s < SLICES; ++s) _mm_prefetch((const char *)q + b * QREC + s * 64 + PREFETCH_L2, _MM_HINT_T1);
#pragma GCC unroll 8
    for (int s = 0; s < SLICES; ++s) _mm_prefetch((const char *)q + b * QREC + s * 64 + PREFETCH_L1, _MM_HINT_T0);
    if ((b & 1) == 0) _mm_prefetch((const char *)(d + b * SPECSERVE_LANES) + PREFETCH_L2, _MM_HINT_T1);
#pragma GCC unroll 8
    for (int s = 0; s < SLICES; ++s) w[s] = _mm512_loadu_si512((const __m512i *)(q + b * QREC + s * 64));
    const __m512 dw = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(d + b * SPECSERVE_LANES)));
    __m512i s0[P], s1[P];
#pragma GCC unroll 8
    for (int i = 0; i < P; ++i) { s0[i] = _mm512_set1_epi32(r[i].negcorr); if (two_chains) s1[i] = _mm512_setzero_si512(); }
#pragma GCC unroll 8
    for (int s = 0; s < SLICES; ++s) {
#pragma GCC unroll 8
        for (int i = 0; i < P; ++i) {
            const int32_t * slice = (const int32_t *)r[i].qs;
            __m512i & chain = two_chains && (s & 1) ? s1[i] : s0[i];
            chain = _mm512_dpbusd_epi32(chain, w[s], _mm512_set1_epi32(slice[s]));
        }
    }
#pragma GCC unroll 8
    for (int i = 0; i < P; ++i) {
        if (two_chains) s0[i] = _mm512_add_epi32(s0[i], s1[i]);
        const __m512 dd = _mm512_mul_ps(dw, _mm512_set1_ps(r[i].d));
        acc[i] = _mm512_fmadd_ps(dd, _mm512_cvtepi32_ps(s0[i]), acc[i]);
    }
}

template <int P>
inline void group_tile(const uint8_t * q, const uint16_t * d, int64_t nb, const act_record * act, int64_t stride,
                       float * dst, size_t dst_stride) {
    __m512 acc[P];
#pragma GCC unroll 8
    for (int i = 0; i < P; ++i) acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; ++b) block_step<P>(q, d, b, act + b * stride, acc);
#pragma GCC unroll 8
    for (int i = 0; i < P; ++i) _mm512_storeu_ps(dst + i * dst_stride, acc[i]);
}

// f(std::integral_constant<int, n>) for n = 1..8 rows: the kernels above are compiled per row count.
template <class F>
inline void with_rows(int n, F && f) {
    switch (n) {
        case 8: f(std::integral_constant<int, 8>{}); break;
        case 7: f(std::integral_constant<int, 7>{}); break;
        case 6: f(std::integral_constant<int, 6>{}); break;
        case 5: f(std::integral_constant<int, 5>{}); break;
        case 4: f(std::integral_constant<int, 4>{}); break;
        case 3: f(std::integral_constant<int, 3>{}); break;
        case 2: f(std::integral_constant<int, 2>{}); break;
        default: f(std::integral_constant<int, 1>{}); break;
    }
}

// Two groups' tiles at once, block by block in turn: each output's arithmetic is group_tile's,
// in the same order, so the bits are the same. A call of one tile (up to 8 rows: decoding,
// verification, a few sequences) waits on the weights' read, and two streams of them in flight, a
// group apart, keep more of it coming than one: engine steps, 2 threads, AMX Xeon, builds
// alternating, 3 rounds, min: 1 row 4.55 -> 4.23 ms, 6 rows 6.95 -> 6.25, 8 rows 7.78 -> 7.13,
// 8 sequences x 1 row 10.29 -> 9.38 (the same with the second group half the range on; four
// groups at once, no better than two).
template <int P>
inline void group_pair(const uint8_t * qa, const uint16_t * da, const uint8_t * qb, const uint16_t * db, int64_t nb,
                       const act_record * act, int64_t stride, float * dst_a, float * dst_b, size_t dst_stride) {
    __m512 acc_a[P], acc_b[P];
#pragma GCC unroll 8
    for (int i = 0; i < P; ++i) { acc_a[i] = _mm512_setzero_ps(); acc_b[i] = _mm512_setzero_ps(); }
    for (int64_t b = 0; b < nb; ++b) {
        block_step<P>(qa, da, b, act + b * stride, acc_a);
        block_step<P>(qb, db, b, act + b * stride, acc_b);
    }
#pragma GCC unroll 8
    for (int i = 0; i < P; ++i) { _mm512_storeu_ps(dst_a + i * dst_stride, acc_a[i]); _mm512_storeu_ps(dst_b + i * dst_stride, acc_b[i]); }
}

}  // namespace

extern "C" void specserve_q8_lanes_matmul(const void * packed, int64_t g0, int64_t ng, int64_t nb,
                                          const void * act, int64_t n_a, int64_t c0, int64_t nc,
                                          float * dst, size_t dst_stride) {
    constexpr int P_MAX = (int)TILE;  // activation rows a tile: 8 accumulators beside 8 weight slices
    const act_record * ar = (const act_record *)act;
    int64_t g = g0;
    if (nc <= P_MAX && c0 / TILE == (c0 + nc - 1) / TILE) {  // one tile of rows: groups in pairs
        const int64_t tile = c0 / TILE, w = tile_width(tile, n_a);
        const act_record * a = ar + tile * TILE * nb + c0 % TILE;
        for (; g + 1 < g0 + ng; g += 2) {
            const uint8_t * qa = (const uint8_t *)packed + g * nb * (QREC + DREC), * qb = qa + nb * (QREC + DREC);
            const uint16_t * da = (const uint16_t *)(qa + nb * QREC), * db = (const uint16_t *)(qb + nb * QREC);
            float * oa = dst + c0 * dst_stride + g * SPECSERVE_LANES, * ob = oa + SPECSERVE_LANES;
            with_rows((int)nc, [&](auto p) { group_pair<decltype(p)::value>(qa, da, qb, db, nb, a, w, oa, ob, dst_stride); });
        }
    }
    for (; g < g0 + ng; ++g) {
        const uint8_t * q = (const uint8_t *)packed + g * nb * (QREC + DREC);
        const uint16_t * d = (const uint16_t *)(q + nb * QREC);
        for (int64_t c = c0; c < c0 + nc;) {  // the group's weights stay in L1/L2 across tiles
            const int64_t tile = c / TILE, w = tile_width(tile, n_a), i = c % TILE;
            int n = (int)(w - i);  // rows left in this tile of the layout, and in the call
            if (c0 + nc - c < n) n = (int)(c0 + nc - c);
            const act_record * a = ar + tile * TILE * nb + i;
            float * out = dst + c * dst_stride + g * SPECSERVE_LANES;
            with_rows(n, [&](auto p) { group_tile<decltype(p)::value>(q, d, nb, a, w, out, dst_stride); });
            c += n;
        }
    }
}

extern "C" int specserve_q8_lanes_compiled(void) { return 1; }

#else  // no AVX-512 VNNI: the specification on the packed layout (exact, slow; hooks stand aside)

extern "C" void specserve_q8_lanes_matmul(const void * packed, int64_t g0, int64_t ng, int64_t nb,
                                          const void * act, int64_t n_a, int64_t c0, int64_t nc,
                                          float * dst, size_t dst_stride) {
    const act_record * ar = (const act_record *)act;
    for (int64_t g = g0; g < g0 + ng; ++g) {
        const uint8_t * q = (const uint8_t *)packed + g * nb * (QREC + DREC);
        const uint16_t * d = (const uint16_t *)(q + nb * QREC);
        for (int64_t c = c0; c < c0 + nc; ++c) {
            for (int l = 0; l < SPECSERVE_LANES; ++l) {
                float acc = 0.0f;
                for (int64_t b = 0; b < nb; ++b) {
                    const act_record & r = ar[record_at(c, b, n_a, nb)];
                    int32_t s = r.negcorr;
                    for (int i = 0; i < SPECSERVE_QK8_0; ++i) {
                        s += (int32_t)q[b * QREC + (i / 4) * 64 + l * 4 + i % 4] * r.qs[i];
                    }
                    acc = fmaf(specserve_half_to_float(d[b * SPECSERVE_LANES + l]) * r.d, (float)s, acc);
                }
                dst[c * dst_stride + g * SPECSERVE_LANES + l] = acc;
            }
        }
    }
}

extern "C" int specserve_q8_lanes_compiled(void) { return 0; }

#endif
