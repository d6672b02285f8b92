// specserve: expf of 8 floats at once, bit for bit what glibc's expf returns (attn_hook.cpp's softmax).
//
// The stock flash-attention loop calls libm's scalar expf once per (query, key); with every query of a
// KV head walking the keys together, that call is the softmax's whole cost (~10% of a verification
// step of 8 tokens on 2 AVX2 cores). A vector exp of our own would change the attention's last bits
// against the stock kernel; this one computes glibc's own algorithm (since glibc 2.28, from Arm's
// optimized-routines: x*32/ln2 = k + r, a 32-entry table of 2^(i/32), a cubic in r, all in double,
// rounded to float once), the same operations in the same order as its FMA build (`__expf_fma`,
// which glibc picks on every CPU with FMA: the only CPUs our hook runs on), four lanes of double at a
// time. So the attention stays bit-identical to the stock kernel.
//
// That holds only for a libm that computes expf this way. `specserve_expf8_proven()` checks, once a
// process, that expf8 equals the expf this process links on 100,000 arguments spread over the range
// the softmax uses, the edges included; where it does not (another libm), the hook calls expf as
// before. tests/native/test_expf8.py checks every float of that range on the machine it runs on.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

namespace specserve {

// the arguments below this give 0 (expf underflows; -inf too); the softmax's arguments are <= 0
constexpr float EXPF_UNDERFLOW = -0x1.9fe368p6f;  // log(2^-150)

struct ExpfTable {
    uint64_t t[32];  // bits of 2^(i/32) as a double, less i << 47 (the exponent k adds back)
    ExpfTable() {
        for (int i = 0; i < 32; ++i) {
            const double v = (double) exp2l((long double) i / 32);  // correctly rounded to double
            std::memcpy(&t[i], &v, sizeof v);
            t[i] -= (uint64_t) i << 47;
        }
    }
};

inline const ExpfTable & expf_table() {
    static const ExpfTable table;
    return table;
}

#if defined(__AVX2__) && defined(__FMA__)
// 4 doubles: 2^(k/32) * (1 + C2 r + C1 r^2 + C0 r^3), k = round(x * 32 / ln 2), r = x * 32 / ln 2 - k
inline __m256d expf4_double(__m256d x, const uint64_t * table) {
    const __m256d shift = _mm256_set1_pd(0x1.8p+52);  // adding it rounds to an integer kept in the low bits
    const __m256d z = _mm256_mul_pd(x, _mm256_set1_pd(0x1.71547652b82fep+0 * 32));
    __m256d kd = _mm256_add_pd(z, shift);
    const __m256i ki = _mm256_castpd_si256(kd);
    kd = _mm256_sub_pd(kd, shift);
    const __m256d r = _mm256_sub_pd(z, kd);
    __m256i t = _mm256_i64gather_epi64((const long long *) table, _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8);
    t = _mm256_add_epi64(t, _mm256_slli_epi64(ki, 47));
    const __m256d p = _mm256_fmadd_pd(_mm256_set1_pd(0x1.c6af84b912394p-5 / 32 / 32 / 32), r,
                                      _mm256_set1_pd(0x1.ebfce50fac4f3p-3 / 32 / 32));
    const __m256d r2 = _mm256_mul_pd(r, r);
    __m256d y = _mm256_fmadd_pd(_mm256_set1_pd(0x1.62e42ff0c52d6p-1 / 32), r, _mm256_set1_pd(1.0));
    y = _mm256_fmadd_pd(p, r2, y);
    return _mm256_mul_pd(y, _mm256_castsi256_pd(t));
}

// expf of 8 floats, each <= 88 (the softmax's are <= 0); below EXPF_UNDERFLOW (and -inf): 0
inline __m256 expf8(__m256 x) {
    const uint64_t * table = expf_table().t;
    const __m128 lo = _mm256_cvtpd_ps(expf4_double(_mm256_cvtps_pd(_mm256_castps256_ps128(x)), table));
    const __m128 hi = _mm256_cvtpd_ps(expf4_double(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1)), table));
    const __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(EXPF_UNDERFLOW), _CMP_LT_OQ);
    return _mm256_andnot_ps(under, _mm256_set_m128(hi, lo));
}

// y[j] = expf(x[j]) for j < n (x's <= 0), 8 at a time
inline void expf_n(const float * x, float * y, int64_t n) {
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) {
        _mm256_storeu_ps(y + j, expf8(_mm256_loadu_ps(x + j)));
    }
    if (j < n) {
        float in[8] = {0}, out[8];
        std::memcpy(in, x + j, (n - j) * sizeof(float));
        _mm256_storeu_ps(out, expf8(_mm256_loadu_ps(in)));
        std::memcpy(y + j, out, (n - j) * sizeof(float));
    }
}

// whether expf8 equals this process's expf (checked once): 100,000 arguments spread evenly over the
// floats in [-110, 0] (every exponent, the underflow edge, subnormal results), plus -0 and -inf
inline bool expf8_matches_libm() {
    static const bool same = [] {
        uint32_t lo = 0x80000000u, hi;  // -0 .. -110 as bit patterns, in increasing order
        const float limit = -110.0f;
        std::memcpy(&hi, &limit, sizeof hi);
        const uint32_t step = (hi - lo) / 100000 + 1;
        float x[8], y[8];
        int n = 0;
        auto flush = [&](int k) {
            for (int i = k; i < 8; ++i) {
                x[i] = -INFINITY;
            }
            _mm256_storeu_ps(y, expf8(_mm256_loadu_ps(x)));
            for (int i = 0; i < 8; ++i) {
                const float e = expf(x[i]);
                if (std::memcmp(&e, &y[i], sizeof e) != 0) {
                    return false;
                }
            }
            return true;
        };
        for (uint64_t u = lo; u <= hi; u += step) {
            const uint32_t bits = (uint32_t) u;
            std::memcpy(&x[n++], &bits, sizeof bits);
            if (n == 8) {
                if (!flush(8)) {
                    return false;
                }
                n = 0;
            }
        }
        const float edge = EXPF_UNDERFLOW;
        x[n++] = edge;
        return flush(n);
    }();
    return same;
}
#else
inline bool expf8_matches_libm() { return false; }  // no vector path: the caller calls expf

inline void expf_n(const float * x, float * y, int64_t n) {
    for (int64_t j = 0; j < n; ++j) {
        y[j] = expf(x[j]);
    }
}
#endif

}  // namespace specserve
