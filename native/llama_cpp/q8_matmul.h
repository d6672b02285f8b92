// specserve's Q8_0 x Q8_0 matmul for llama.cpp's CPU backend: each weight block is read
// once for all activation rows of a call, and every output element is computed with the
// same arithmetic, in the same order, as ggml's own vec_dot_q8_0_q8_0 (AVX2 form), whatever
// the number of rows. So a row's result is bit-identical at M = 1 and at M = 64, and
// bit-identical to llama.cpp's stock kernels (vec_dot for one row, llamafile's tinyBLAS for
// more), which compute each element the same way.
//
// The arithmetic of one output element (weight row w, activation row a, nb blocks of 32):
//   acc[0..7] = 0
//   for each block b:
//     q[l]   = sum of w.qs[4l+j] * a.qs[4l+j], j = 0..3          (exact, int32)
//     d      = fp32(w[b].d) * fp32(a[b].d)                       (one float rounding)
//     acc[l] = fma(d, float(q[l]), acc[l])                       (l = 0..7)
//   out = ((acc0 + acc4) + (acc2 + acc6)) + ((acc1 + acc5) + (acc3 + acc7))
// (the last line is ggml's hsum_float_8). Only the loops around it change with the shapes.
//
// No ggml header is needed: the kernel sees raw blocks, so it can be compiled and tested on
// its own (tests/native/test_q8_matmul.py) as well as inside ggml (ggml_hook.c).
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SPECSERVE_QK8_0 32

typedef struct {
    uint16_t d;                    // the block's scale, IEEE half
    int8_t   qs[SPECSERVE_QK8_0];  // its 32 quants
} specserve_block_q8_0;

// dst[c * dst_stride + r] = dot(w row r, a row c) for r < n_w, c < n_a: rows of nb blocks,
// w rows w_row_bytes apart, a rows a_row_bytes apart. Any n_w, n_a >= 0.
void specserve_q8_0_matmul(const void * w, size_t w_row_bytes, int64_t n_w,
                           const void * a, size_t a_row_bytes, int64_t n_a,
                           int64_t nb, float * dst, size_t dst_stride);

// The same in two parts, for callers that take many weight chunks against the same activation
// rows (ggml_hook.c): the activations' scales laid out once (act_scales_size floats), then any
// chunk of weight rows against them.
// The layout is the SIMD path's own (groups of 4 rows for AVX2, 8 for AVX-512); a call on rows
// from `row` (a multiple of SPECSERVE_Q8_0_ACT_GROUP) passes specserve_q8_0_act_scales_from(act_scales,
// row, nb). The buffer should be 64-byte aligned (the AVX-512 path reads it in 64-byte records).
#define SPECSERVE_Q8_0_ACT_GROUP 8
const float * specserve_q8_0_act_scales_from(const float * act_scales, int64_t row, int64_t nb);
size_t specserve_q8_0_act_scales_size(int64_t n_a, int64_t nb);
void specserve_q8_0_act_scales(const void * a, size_t a_row_bytes, int64_t n_a, int64_t nb, float * out);
void specserve_q8_0_matmul_scaled(const void * w, size_t w_row_bytes, int64_t n_w,
                                  const void * a, size_t a_row_bytes, int64_t n_a, int64_t nb,
                                  const float * act_scales, float * dst, size_t dst_stride);

// The same, one element at a time in plain C: the specification the SIMD paths must match
// bit for bit (used where no SIMD path is compiled, and by the tests).
void specserve_q8_0_matmul_ref(const void * w, size_t w_row_bytes, int64_t n_w,
                               const void * a, size_t a_row_bytes, int64_t n_a,
                               int64_t nb, float * dst, size_t dst_stride);

// Both cache lines that a row of nb Q8_0 blocks may touch, fetched into L1. Attention reads the
// KV cache once a step, after the weights' ~145 MB went through the caches, so its rows are cold;
// fetched a few dozen rows ahead they are not waited for (a prefetch never faults: one past a
// buffer's end costs nothing wrong).
static inline void specserve_prefetch_row(const void * row, int64_t nb) {
    __builtin_prefetch(row, 0, 3);
    __builtin_prefetch((const char *)row + nb * sizeof(specserve_block_q8_0) - 1, 0, 3);
}

// IEEE half to float, exactly (the specifications' conversion; SIMD paths use F16C's).
float specserve_half_to_float(uint16_t h);

// Which path specserve_q8_0_matmul runs: "avx512vnni" (512-bit, q8_matmul_avx512.inc), "avxvnni"
// or "avx2" (256-bit), or "ref".
const char * specserve_q8_0_matmul_isa(void);

#ifdef __cplusplus
}
#endif
