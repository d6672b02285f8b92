// specserve: attention scores with the keys in SIMD lanes, by the lanes matmul (attn_scores.h says
// why and in which order).
#include "attn_scores.h"

#include "q8_lanes.h"
#include "q8_matmul.h"

#include <string.h>

#include <algorithm>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512VNNI__) && defined(__F16C__)
#include <immintrin.h>
#define SPECSERVE_SCORES_SIMD 1
#endif

namespace {

constexpr int LANES = SPECSERVE_LANES;  // keys a group: the matmul's weight rows a group

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

// Key rows fetched this far ahead of their packing (specserve_prefetch_row): unfetched, 40% of
// the scores' time was the first load of a row (2-core AMX Xeon, decoding at 256 cached).
constexpr int64_t KEYS_AHEAD = 32;
constexpr size_t GROUP_BYTES_A_BLOCK = LANES * (SPECSERVE_QK8_0 + 2);  // a block's 512 quant + 32 scale bytes

// 16 keys' blocks to a weight group of the lanes matmul (q8_lanes.h): each block's 16 rows of
// 8 dwords transposed to 8 slices of 16 lanes (a 256-bit half each: rows 0-7 and 8-15) and offset
// to unsigned bytes; the 16 half scales by one gather (the low half of each dword at a scale).
void pack_keys(const char * rows, size_t row_bytes, int64_t nb, uint8_t * q, uint16_t * d) {
    const __m512i offset = _mm512_set1_epi8((char)0x80);
    const __m512i lo = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13), hi = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    const __m512i at = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32((int)row_bytes));
    for (int64_t b = 0; b < nb; ++b) {
        const char * blk = rows + b * sizeof(specserve_block_q8_0);
        __m512i z[8], t[8], u[8];
        for (int j = 0; j < 8; ++j) {  // rows j and j + 8
            const __m256i r0 = _mm256_loadu_si256((const __m256i *)(blk + j * row_bytes + 2));
            const __m256i r8 = _mm256_loadu_si256((const __m256i *)(blk + (j + 8) * row_bytes + 2));
            z[j] = _mm512_inserti64x4(_mm512_castsi256_si512(r0), r8, 1);
        }
        for (int j = 0; j < 8; j += 2) {
            t[j] = _mm512_unpacklo_epi32(z[j], z[j + 1]);
            t[j + 1] = _mm512_unpackhi_epi32(z[j], z[j + 1]);
        }
        for (int j = 0; j < 8; j += 4) {
            u[j] = _mm512_unpacklo_epi64(t[j], t[j + 2]);
            u[j + 1] = _mm512_unpackhi_epi64(t[j], t[j + 2]);
            u[j + 2] = _mm512_unpacklo_epi64(t[j + 1], t[j + 3]);
            u[j + 3] = _mm512_unpackhi_epi64(t[j + 1], t[j + 3]);
        }
        uint8_t * out = q + b * LANES * SPECSERVE_QK8_0;
        for (int s = 0; s < 4; ++s) {  // u[s]: slices s and s + 4 of rows 0-3 (8-11); u[s + 4]: of rows 4-7 (12-15)
            _mm512_storeu_si512(out + s * 64, _mm512_xor_si512(_mm512_permutex2var_epi64(u[s], lo, u[s + 4]), offset));
            _mm512_storeu_si512(out + (s + 4) * 64, _mm512_xor_si512(_mm512_permutex2var_epi64(u[s], hi, u[s + 4]), offset));
        }
        const __m512i scales = _mm512_i32gather_epi32(at, blk, 1);
        _mm256_store_si256((__m256i *)(d + b * LANES), _mm512_cvtepi32_epi16(scales));
    }
}

}  // namespace

extern "C" void specserve_attn_scores(const void * k_rows, size_t k_row_bytes, int64_t n_keys, const void * q8,
                                      size_t q_row, int64_t nq, int64_t nb, float * scores, size_t pad) {
    static thread_local std::vector<uint8_t> buf;
    const int64_t groups = (n_keys + LANES - 1) / LANES;
    const size_t packed_bytes = (size_t)groups * nb * GROUP_BYTES_A_BLOCK;
    const size_t row = nb * sizeof(specserve_block_q8_0), tail_bytes = LANES * row;
    buf.resize(packed_bytes + specserve_q8_lanes_act_size(nq, nb) + tail_bytes + 64);
    uint8_t * packed = (uint8_t *)(((uintptr_t)buf.data() + 63) & ~(uintptr_t)63);  // the scales' aligned loads
    uint8_t * act = packed + packed_bytes;
    char * tail = (char *)act + specserve_q8_lanes_act_size(nq, nb);
    for (int64_t k = 0; k < std::min<int64_t>(KEYS_AHEAD, n_keys); ++k) {  // the first rows
        specserve_prefetch_row((const char *)k_rows + k * k_row_bytes, nb);
    }
    for (int64_t g = 0; g < groups; ++g) {
        const int64_t k0 = g * LANES, n = std::min<int64_t>(LANES, n_keys - k0);
        for (int64_t k = k0 + KEYS_AHEAD; k < std::min(k0 + KEYS_AHEAD + LANES, n_keys); ++k) {
            specserve_prefetch_row((const char *)k_rows + k * k_row_bytes, nb);
        }
        uint8_t * q = packed + g * nb * GROUP_BYTES_A_BLOCK;
        uint16_t * d = (uint16_t *)(q + nb * LANES * SPECSERVE_QK8_0);
        if (n == LANES) {
            pack_keys((const char *)k_rows + k0 * k_row_bytes, k_row_bytes, nb, q, d);
        } else {  // the last keys, beside zero keys (zero quants and scale: scores 0)
            memset(tail, 0, tail_bytes);
            for (int64_t k = 0; k < n; ++k) memcpy(tail + k * row, (const char *)k_rows + (k0 + k) * k_row_bytes, row);
            pack_keys(tail, row, nb, q, d);
        }
    }
    specserve_q8_lanes_act(q8, q_row, nq, nb, act);
    specserve_q8_lanes_matmul(packed, 0, groups, nb, act, nq, 0, nq, scores, pad);
    for (int64_t i = 0; i < nq; ++i) {
        for (size_t k = (size_t)groups * LANES; k < pad; ++k) scores[i * pad + k] = 0.0f;
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
