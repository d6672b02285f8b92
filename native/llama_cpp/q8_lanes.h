// specserve's rows-in-lanes Q8_0 matmul: Q8_0 weights repacked 16 rows to a group, so that each
// 32-bit SIMD lane of an AVX-512 register is one weight row. A block's 32 products of a row are
// summed exactly in int32 by 8 vpdpbusd (one per 4-byte slice of the block, the activation's slice
// broadcast to all lanes), then one convert, one scale product and one fma serve 16 rows. Per
// activation row that is ~0.7 vector instructions a block-row, against ~2 for the stock order
// (8 int32 lanes a block-row, a horizontal sum at the end), so verifying 8 tokens costs about
// what reading the weights once costs.
//
// The arithmetic of one output element (weight row w, activation row a, nb blocks of 32):
//   acc = 0
//   for each block b:
//     q   = sum of w.qs[i] * a.qs[i], i = 0..31                  (exact, int32)
//     d   = fp32(w[b].d) * fp32(a[b].d)                           (one float rounding)
//     acc = fma(d, float(q), acc)                                 (float(q) is exact: |q| < 2^24)
//   out = acc
// It is not llama.cpp's order (ggml's vec_dot keeps 8 partial sums and adds them at the end), so
// the result differs from the stock kernels' in the last bits; but it is one order for every
// number of activation rows, so a row's logits do not depend on what shares the step: decoding
// (1 row), verification and batches all run it (ggml_hook.c).
//
// No ggml header is needed: the kernel sees raw blocks (tests/native/test_q8_lanes.py compiles
// it on its own).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "q8_matmul.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SPECSERVE_LANES 16  // weight rows a group: the 16 int32 lanes of a 512-bit register

// The repacked weights: for each group of 16 rows, nb records of 512 bytes (8 slices x 16 rows x
// 4 bytes, each byte w + 128: vpdpbusd multiplies unsigned by signed bytes), then nb records of
// 16 half scales (32 bytes). n_w must be a multiple of SPECSERVE_LANES.
size_t specserve_q8_lanes_size(int64_t n_w, int64_t nb);
void specserve_q8_lanes_pack(const void * w, size_t w_row_bytes, int64_t n_w, int64_t nb, void * out);

// The activations as the kernel reads them, laid out once a call: 48 bytes for each block and row
// (the 32 quants, -128 x their sum: the offset's exact correction, fp32(d)), rows in tiles of 8,
// [tile][block][row in tile]: the kernel's tile of rows reads one stream of memory, block after
// block (laid out [block][row], a tile's next block was n_a x 48 bytes on, past the hardware
// prefetcher's reach once prefill's hundreds of rows put it pages away).
size_t specserve_q8_lanes_act_size(int64_t n_a, int64_t nb);
void specserve_q8_lanes_act(const void * a, size_t a_row_bytes, int64_t n_a, int64_t nb, void * out);

// The same layout straight from fp32 activation rows (x_row_bytes apart), each block of 32
// quantized exactly as ggml's x86 quantize_row_q8_0 does it (d = half(amax / 127), quants
// x * (127 / amax) rounded to nearest even), so that it equals specserve_q8_lanes_act of ggml's
// own quantization byte for byte: the hook then needs no shared buffer and no barrier.
void specserve_q8_lanes_act_f32(const float * x, size_t x_row_bytes, int64_t n_a, int64_t nb, void * out);

// Groups [g0, g0 + ng) of packed weights against activation rows [c0, c0 + nc) of a layout of n_a
// rows: dst[c * dst_stride + 16 g + l] for row 16 g + l. The output's bits depend only on the
// weight row and the activation row, never on g0, ng, c0, nc or n_a.
void specserve_q8_lanes_matmul(const void * packed, int64_t g0, int64_t ng, int64_t nb,
                               const void * act, int64_t n_a, int64_t c0, int64_t nc,
                               float * dst, size_t dst_stride);

// The same element by element in plain C from ggml's own layout: the specification the SIMD path
// must match bit for bit.
void specserve_q8_lanes_ref(const void * w, size_t w_row_bytes, int64_t n_w,
                            const void * a, size_t a_row_bytes, int64_t n_a,
                            int64_t nb, float * dst, size_t dst_stride);

// 1 where the SIMD path is compiled (AVX-512 with VNNI); elsewhere the hooks do not use this
// arithmetic (the plain C one would be exact but slow).
int specserve_q8_lanes_compiled(void);

#ifdef __cplusplus
}
#endif
