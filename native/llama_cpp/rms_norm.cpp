// specserve's RMS norm of fp32 rows: see rms_norm.h.
#include "rms_norm.h"

#include <math.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace {

constexpr int PARTS = 16;  // double partial sums: element i goes to part i % PARTS

// The parts in a fixed tree: the four 4-lane registers' lanes added register-wise
// ((p0 + p4) + (p8 + p12), ...), then the four lanes as (l0 + l2) + (l1 + l3).
double combine(const double * p) {
    double l[4];
    for (int j = 0; j < 4; ++j) l[j] = (p[j] + p[4 + j]) + (p[8 + j] + p[12 + j]);
    return (l[0] + l[2]) + (l[1] + l[3]);
}

// What follows the sum, as ggml's rms_norm computes it.
void scale_row(const float * x, const float * w, float * y, int64_t from, int64_t n, float scale) {
    for (int64_t i = from; i < n; ++i) y[i] = w ? x[i] * scale * w[i] : x[i] * scale;
}

float scale_of(double sum, int64_t n, float eps) {
    const float mean = (float)(sum / (double)n);
    return 1.0f / sqrtf(mean + eps);
}

}  // namespace

extern "C" void specserve_rms_norm_row_ref(const float * x, const float * w, float * y, int64_t n, float eps) {
    double p[PARTS] = {0};
    const int64_t body = n / PARTS * PARTS;
    for (int64_t i = 0; i < body; ++i) p[i % PARTS] += (double)(x[i] * x[i]);
    double sum = combine(p);
    for (int64_t i = body; i < n; ++i) sum += (double)(x[i] * x[i]);  // the tail after the tree, in order
    scale_row(x, w, y, 0, n, scale_of(sum, n, eps));
}

#if defined(__AVX2__)

extern "C" int specserve_rms_norm_row(const float * x, const float * w, float * y, int64_t n, float eps) {
    __m256d a[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd()};
    const int64_t body = n / PARTS * PARTS;
    for (int64_t i = 0; i < body; i += PARTS) {
        const __m256 lo = _mm256_loadu_ps(x + i), hi = _mm256_loadu_ps(x + i + 8);
        const __m256 s0 = _mm256_mul_ps(lo, lo), s1 = _mm256_mul_ps(hi, hi);  // float squares, as ggml's
        a[0] = _mm256_add_pd(a[0], _mm256_cvtps_pd(_mm256_castps256_ps128(s0)));
        a[1] = _mm256_add_pd(a[1], _mm256_cvtps_pd(_mm256_extractf128_ps(s0, 1)));
        a[2] = _mm256_add_pd(a[2], _mm256_cvtps_pd(_mm256_castps256_ps128(s1)));
        a[3] = _mm256_add_pd(a[3], _mm256_cvtps_pd(_mm256_extractf128_ps(s1, 1)));
    }
    double p[PARTS];
    for (int j = 0; j < 4; ++j) _mm256_storeu_pd(p + 4 * j, a[j]);
    double sum = combine(p);
    for (int64_t i = body; i < n; ++i) sum += (double)(x[i] * x[i]);
    const float scale = scale_of(sum, n, eps);
    const __m256 s = _mm256_set1_ps(scale);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), s);
        _mm256_storeu_ps(y + i, w ? _mm256_mul_ps(v, _mm256_loadu_ps(w + i)) : v);
    }
    scale_row(x, w, y, i, n, scale);
    return 1;
}

#else

extern "C" int specserve_rms_norm_row(const float *, const float *, float *, int64_t, float) {
    return 0;
}

#endif
