// specserve's RMS norm of fp32 rows (llama.cpp's RMS_NORM, and RMS_NORM fused with the MUL by the
// norm's weights that follows it in every layer). ggml's loop adds the squares one at a time in a
// double: a dependent chain of 576 double adds a row, ~1 ns an element, scalar. Two norms a layer
// and token made it 3-4% of a 416-token prefill and ~0.2 ms of a verification step of 8 tokens on
// a 2-core Xeon. Here the squares are added in 16 double partial sums (element i into sum i % 16,
// in order), combined in a fixed tree; then the same float arithmetic as ggml's:
//   mean = (float)(sum / n), scale = 1 / sqrtf(mean + eps), y = (x * scale) * w  (or x * scale).
// Only the association of the double sum differs from ggml's, so the float mean is ggml's in all
// but rare roundings; each row depends only on itself, so no row depends on what shares the step.
// It runs where the rows-in-lanes matmul serves the model (q8_lanes.h: no stock bit is kept
// anyway); in llama.cpp's order ggml's loop runs, so that every logit stays the stock kernels'.
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// y = rms_norm(x) (* w, where w is not null) for one row of n floats; y may be x. Returns 0 (and
// writes nothing) where the SIMD path (AVX2) is not compiled.
int specserve_rms_norm_row(const float * x, const float * w, float * y, int64_t n, float eps);

// The same in plain C, in the same order: the specification.
void specserve_rms_norm_row_ref(const float * x, const float * w, float * y, int64_t n, float eps);

#ifdef __cplusplus
}
#endif
