// specserve's fast Walsh-Hadamard transform: see fwht.h.
#include "fwht.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

extern "C" void specserve_fwht_row_ref(const float * src, float * dst, int64_t n, float scale) {
    for (int64_t j = 0; j < n; ++j) dst[j] = src[j] * scale;
    for (int64_t len = 1; len < n; len <<= 1) {
        for (int64_t i = 0; i < n; i += 2 * len) {
            for (int64_t j = 0; j < len; ++j) {
                const float u = dst[i + j], v = dst[i + len + j];
                dst[i + j] = u + v;
                dst[i + len + j] = u - v;
            }
        }
    }
}

#if defined(__AVX512F__)

namespace {

// One level inside a register: lanes whose bit `len` is clear get u + v (v: the lane len above),
// the others u - v (u: the lane len below); `swap` exchanges each lane with its partner.
inline __m512 level(__m512 x, __m512 swapped, __mmask16 upper) {
    return _mm512_mask_sub_ps(_mm512_add_ps(x, swapped), upper, swapped, x);
}

inline __m512 levels_in_register(__m512 x) {
    x = level(x, _mm512_permute_ps(x, 0xB1), 0xAAAA);             // pairs 1 apart
    x = level(x, _mm512_permute_ps(x, 0x4E), 0xCCCC);             // 2 apart
    x = level(x, _mm512_shuffle_f32x4(x, x, 0xB1), 0xF0F0);       // 4 apart: 128-bit lanes swapped
    return level(x, _mm512_shuffle_f32x4(x, x, 0x4E), 0xFF00);    // 8 apart: 256-bit halves swapped
}

}  // namespace

extern "C" int specserve_fwht_row(const float * src, float * dst, int64_t n, float scale) {
    if (n < 16 || (n & (n - 1)) != 0) return 0;
    const __m512 s = _mm512_set1_ps(scale);
    if (n == 64) {  // attention's head size: all six levels in four registers
        __m512 a = levels_in_register(_mm512_mul_ps(_mm512_loadu_ps(src), s));
        __m512 b = levels_in_register(_mm512_mul_ps(_mm512_loadu_ps(src + 16), s));
        __m512 c = levels_in_register(_mm512_mul_ps(_mm512_loadu_ps(src + 32), s));
        __m512 d = levels_in_register(_mm512_mul_ps(_mm512_loadu_ps(src + 48), s));
        __m512 t;
        t = _mm512_add_ps(a, b); b = _mm512_sub_ps(a, b); a = t;  // 16 apart
        t = _mm512_add_ps(c, d); d = _mm512_sub_ps(c, d); c = t;
        _mm512_storeu_ps(dst, _mm512_add_ps(a, c));                // 32 apart
        _mm512_storeu_ps(dst + 32, _mm512_sub_ps(a, c));
        _mm512_storeu_ps(dst + 16, _mm512_add_ps(b, d));
        _mm512_storeu_ps(dst + 48, _mm512_sub_ps(b, d));
        return 1;
    }
    for (int64_t i = 0; i < n; i += 16) {
        _mm512_storeu_ps(dst + i, levels_in_register(_mm512_mul_ps(_mm512_loadu_ps(src + i), s)));
    }
    for (int64_t len = 16; len < n; len <<= 1) {
        for (int64_t i = 0; i < n; i += 2 * len) {
            for (int64_t j = 0; j < len; j += 16) {
                const __m512 u = _mm512_loadu_ps(dst + i + j), v = _mm512_loadu_ps(dst + i + len + j);
                _mm512_storeu_ps(dst + i + j, _mm512_add_ps(u, v));
                _mm512_storeu_ps(dst + i + len + j, _mm512_sub_ps(u, v));
            }
        }
    }
    return 1;
}

#else

extern "C" int specserve_fwht_row(const float *, float *, int64_t, float) { return 0; }

#endif
