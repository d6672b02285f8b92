// What ggml's CPU backend calls of specserve's kernels (ggml-cpu.patch includes this), and what
// they export to Python (backend/engines/q8_kernel.py reads them with ctypes).
#pragma once

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

struct ggml_compute_params;
struct ggml_tensor;

// ggml_compute_forward_mul_mat, after src1 is quantized into `a` (Q8_0 rows a_row_bytes apart):
// true if the product was computed here (ggml_hook.c)
bool specserve_q8_0_mul_mat(const struct ggml_compute_params * params, const struct ggml_tensor * dst,
                            const void * a, size_t a_row_bytes);

// ggml_compute_forward_mul_mat, before src1 is quantized: true if the product was computed here
// from src1's fp32 rows with the lanes kernel (ggml_hook.c); then no thread touches the work buffer
bool specserve_q8_lanes_mul_mat_f32(const struct ggml_compute_params * params, const struct ggml_tensor * dst);

// the rows-in-lanes copy of a weight matrix (lanes_weights.cpp), made on first use; NULL where
// the matrix does not qualify or the lanes arithmetic is off
const void * specserve_q8_lanes_weights(const struct ggml_tensor * w);

// ggml_graph_compute_thread, before its first node: this thread starts a new graph (ggml_hook.c)
void specserve_graph_begin(void);

// ggml_compute_forward_flash_attn_ext_f16, first: true if computed here (attn_hook.cpp)
bool specserve_flash_attn_q8_0(const struct ggml_compute_params * params, struct ggml_tensor * dst);

#define SPECSERVE_EXPORT __attribute__((visibility("default")))

SPECSERVE_EXPORT int specserve_q8_0_enabled(void);            // 1: our kernels take what they can
SPECSERVE_EXPORT void specserve_q8_0_set_enabled(int on);     // (SPECSERVE_Q8_MATMUL=0 starts off)
SPECSERVE_EXPORT const char * specserve_q8_0_isa(void);       // avx512vnni / avxvnni / avx2 / ref
SPECSERVE_EXPORT long long specserve_q8_0_calls(void);        // matmuls run here so far
SPECSERVE_EXPORT long long specserve_attn_q8_0_calls(void);   // attention ops run here so far
SPECSERVE_EXPORT int specserve_q8_lanes_enabled(void);        // 1: weights the lanes kernel can take use it,
SPECSERVE_EXPORT void specserve_q8_lanes_set_enabled(int on); //    at every row count (SPECSERVE_Q8_LANES=0 starts off)
SPECSERVE_EXPORT long long specserve_q8_lanes_calls(void);    // matmuls run by the lanes kernel so far
SPECSERVE_EXPORT long long specserve_q8_lanes_act_reuses(void); // of which reused the activations' layout
SPECSERVE_EXPORT long long specserve_q8_lanes_bytes(void);    // bytes of rows-in-lanes weight copies held
SPECSERVE_EXPORT long long specserve_q8_lanes_locked_lookups(void); // copies looked up under the registry's lock

#ifdef __cplusplus
}
#endif
