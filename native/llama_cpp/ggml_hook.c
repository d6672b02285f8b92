// The glue between ggml's CPU matmul and specserve's Q8_0 kernels (q8_lanes.h, q8_matmul.h).
//
// patches/ggml-cpu.patch calls specserve_q8_0_mul_mat from ggml_compute_forward_mul_mat,
// after ggml has quantized the activations (src1, F32) into Q8_0 rows in its work buffer
// with its own quantize_row_q8_0 and every thread has passed the barrier, just where the
// stock code would hand the same rows to llamafile's tinyBLAS. It takes 2-D products of
// Q8_0 weights and returns false for anything else, which then runs the stock code unchanged.
//
// Two arithmetics, one per weight matrix, each the same for every number of rows:
// - rows in lanes (q8_lanes.h), on AVX-512 VNNI CPUs, for a model's weight matrices whose rows
//   come in groups of 16: every row count, decoding's one row included, so that no row's result
//   depends on the step it is in. Verifying 8 tokens then costs little more than reading the
//   weights once.
// - llama.cpp's own order (q8_matmul.h) for the rest, every row count: ggml's vec_dot computes one
//   row the same bits, but in one dependent chain a row with the next rows fetched only as it
//   reads them, so decoding waited on both (a step on a build limited to AVX2, 2-core Sapphire
//   Rapids VM: 12.5 ms with vec_dot, 7.7 here; AVX-512 in this order: 12.2 -> 8.8).
//
// Threads take chunks (a range of weight rows x a range of activation rows) from ggml's
// shared chunk counter, as the stock code does: who computes an element changes nothing in
// how it is computed.
#include "ggml-cpu-impl.h"
#include "ggml-impl.h"
#include "q8_lanes.h"
#include "q8_matmul.h"
#include "specserve.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

// -1: not read yet; then 0 (stock kernels) or 1. SPECSERVE_Q8_MATMUL=0 in the environment
// starts it off; specserve_q8_0_set_enabled switches it at run time (benchmarks compare both
// in one process).
static atomic_int specserve_enabled = -1;

int specserve_q8_0_enabled(void) {
    int on = atomic_load_explicit(&specserve_enabled, memory_order_relaxed);
    if (on < 0) {
        const char * env = getenv("SPECSERVE_Q8_MATMUL");
        // Without a SIMD path the plain-C one would be exact but slow, and ggml's own non-AVX2
        // vec_dot sums in another order: one row (vec_dot) and several (ours) would then
        // differ. So there the stock kernels serve everything.
        on = !(env && strcmp(env, "0") == 0) && strcmp(specserve_q8_0_matmul_isa(), "ref") != 0;
        atomic_store_explicit(&specserve_enabled, on, memory_order_relaxed);
    }
    return on;
}

void specserve_q8_0_set_enabled(int on) {
    on = on && strcmp(specserve_q8_0_matmul_isa(), "ref") != 0;
    atomic_store_explicit(&specserve_enabled, on ? 1 : 0, memory_order_relaxed);
}

const char * specserve_q8_0_isa(void) {
    return specserve_q8_0_matmul_isa();
}

// How many times this process took the kernel (tests check a real model goes through it).
static atomic_llong specserve_calls = 0, specserve_lanes_calls = 0, specserve_lanes_reuses = 0;

long long specserve_q8_0_calls(void) {
    return atomic_load_explicit(&specserve_calls, memory_order_relaxed);
}

long long specserve_q8_lanes_calls(void) {
    return atomic_load_explicit(&specserve_lanes_calls, memory_order_relaxed);
}

long long specserve_q8_lanes_act_reuses(void) {
    return atomic_load_explicit(&specserve_lanes_reuses, memory_order_relaxed);
}

// Graphs this thread has begun computing (ggml_graph_compute_thread calls specserve_graph_begin
// before its first node): within one graph a tensor's contents do not change once computed, so a
// product's activations laid out for one weight matrix serve the next product of the same src1
// tensor (Q, K and V read one normed row; the FFN's gate and up another).
static _Thread_local unsigned long long specserve_graph = 0;

void specserve_graph_begin(void) {
    ++specserve_graph;
}

enum {
    W_CHUNK_MAX = 64,  // weight rows a chunk: 64 x 1632 B of K = 1536 weights stay in L2 beside the rows below
    W_CHUNK_MIN = 16,
    A_CHUNK = 64,      // activation rows a chunk (a multiple of SPECSERVE_Q8_0_ACT_GROUP): more only for prefill
};

// Weight rows a chunk: at least 4 chunks a thread where the matrix allows (192-row K/V
// projections on 2 threads: 24 rows, 8 chunks, not 64 rows split 2:1), a multiple of `unit`
// (the tiles take 2 weight rows with AVX2, 4 with AVX-512, the lanes kernel 16).
static int64_t weight_chunk(int64_t n_w, int nth, int64_t unit) {
    int64_t rows = (n_w + 4 * nth - 1) / (4 * nth);
    rows = rows < W_CHUNK_MIN ? W_CHUNK_MIN : rows > W_CHUNK_MAX ? W_CHUNK_MAX : rows;
    return (rows + unit - 1) / unit * unit;
}

// *buf grown to at least `size` bytes, 64-byte aligned (its contents are not kept).
static void * grown(void ** buf, size_t * cap, size_t size) {
    if (*cap < size) {
        free(*buf);
        *buf = aligned_alloc(64, (size + 63) & ~(size_t)63);
        if (!*buf) {
            GGML_ABORT("specserve: out of memory for %zu bytes of activations", size);
        }
        *cap = size;
    }
    return *buf;
}

// A buffer of at least `size` bytes, 64-byte aligned, kept by the calling thread between calls.
static void * thread_buffer(size_t size) {
    static _Thread_local void * buf = NULL;
    static _Thread_local size_t cap = 0;
    return grown(&buf, &cap, size);
}

// The lanes arithmetic for any number of activation rows (packed: the weights' lanes copy).
static void lanes_mul_mat(const struct ggml_compute_params * params, const struct ggml_tensor * dst,
                          const void * packed, const void * a, size_t a_row_bytes) {
    const struct ggml_tensor * src0 = dst->src[0];
    const int64_t n_w = src0->ne[1], n_a = dst->src[1]->ne[1], nb = src0->ne[0] / SPECSERVE_QK8_0;
    const size_t dst_stride = dst->nb[1] / sizeof(float);
    const int64_t w_chunk = weight_chunk(n_w, params->nth, SPECSERVE_LANES);
    const int64_t w_chunks = (n_w + w_chunk - 1) / w_chunk, a_chunks = (n_a + A_CHUNK - 1) / A_CHUNK;
    if (params->ith == 0) {
        atomic_fetch_add_explicit(&specserve_lanes_calls, 1, memory_order_relaxed);
    }
    // the activations laid out once a call (each thread its own copy: no barrier)
    void * act = thread_buffer(specserve_q8_lanes_act_size(n_a, nb));
    specserve_q8_lanes_act(a, a_row_bytes, n_a, nb, act);
    for (int64_t chunk = params->ith; chunk < w_chunks * a_chunks; chunk = ggml_threadpool_chunk_add(params->threadpool, 1)) {
        const int64_t ca = chunk / w_chunks, cw = chunk % w_chunks;  // weight chunks vary fastest
        const int64_t r0 = cw * w_chunk, c0 = ca * A_CHUNK;
        const int64_t nr = n_w - r0 < w_chunk ? n_w - r0 : w_chunk;
        const int64_t nc = n_a - c0 < A_CHUNK ? n_a - c0 : A_CHUNK;
        specserve_q8_lanes_matmul(packed, r0 / SPECSERVE_LANES, nr / SPECSERVE_LANES, nb, act, n_a, c0, nc,
                                  (float *)dst->data, dst_stride);
    }
}

// What both entries take: a 2-D product of plain (not repacked by ggml) Q8_0 weights into fp32
// rows, with our kernels switched on.
static bool takes(const struct ggml_tensor * dst) {
    const struct ggml_tensor * src0 = dst->src[0];
    const struct ggml_tensor * src1 = dst->src[1];
    return src0->type == GGML_TYPE_Q8_0 && src0->extra == NULL && specserve_q8_0_enabled() &&
           src0->ne[2] == 1 && src0->ne[3] == 1 && src1->ne[2] == 1 && src1->ne[3] == 1 &&
           src0->ne[0] % SPECSERVE_QK8_0 == 0 && dst->nb[0] == sizeof(float);
}

// The fp32 entry's activations in the lanes layout, each thread its own, kept for the next product
// of the same src1 in the same graph: laying out 8 rows of K = 576 costs about what their product
// with a 192-row K/V projection does. Reused only for the same tensor, at the same address and
// shape, in the graph that computed it (ggml's allocator gives a tensor's memory to another only
// after its last reader ran, and that other tensor is another struct).
struct act_cache {
    unsigned long long graph;
    const struct ggml_tensor * src1;
    const void * data;
    int64_t n_a, nb;
    size_t row_bytes;
    void * buf;
    size_t cap;
};

static void * act_for(const struct ggml_compute_params * params, const struct ggml_tensor * src1, const float * x,
                      int64_t n_a, int64_t nb) {
    static _Thread_local struct act_cache cache;
    struct act_cache * c = &cache;  // one TLS lookup
    const unsigned long long graph = specserve_graph;
    if (graph != 0 && c->graph == graph && c->src1 == src1 && c->data == x && c->n_a == n_a && c->nb == nb &&
        c->row_bytes == src1->nb[1]) {
        if (params->ith == 0) {
            atomic_fetch_add_explicit(&specserve_lanes_reuses, 1, memory_order_relaxed);
        }
        return c->buf;
    }
    grown(&c->buf, &c->cap, specserve_q8_lanes_act_size(n_a, nb));
    specserve_q8_lanes_act_f32(x, src1->nb[1], n_a, nb, c->buf);
    *c = (struct act_cache){graph, src1, x, n_a, nb, src1->nb[1], c->buf, c->cap};
    return c->buf;
}

// Every product of a packed matrix, straight from src1's fp32 rows, before ggml quantizes them
// into its shared work buffer, with neither ggml's barrier after that quantization nor its chunk
// counter (which that barrier orders). Its bits equal the path below: the same quantization
// (q8_lanes.h) and the same kernel, element by element.
// - Up to A_CHUNK rows (decoding, verification, batched decode): each thread quantizes all rows
//   into its own layout (a few thousand numbers: cheaper than waiting for the other) and takes a
//   fixed share of the weight groups.
// - More (prefill, large verification batches): each thread takes a fixed share of the rows,
//   lays out only those and multiplies them by every weight group. The weights are then read
//   once a thread, which the many rows repay; ggml's way quantized all rows for every product
//   (Q, K and V each) and our layout of them was made by both threads (416-token prefill: 13% of
//   its time).
bool specserve_q8_lanes_mul_mat_f32(const struct ggml_compute_params * params, const struct ggml_tensor * dst) {
    const struct ggml_tensor * src0 = dst->src[0];
    const struct ggml_tensor * src1 = dst->src[1];
    if (!takes(dst) || src1->type != GGML_TYPE_F32 || src1->nb[0] != sizeof(float)) {
        return false;
    }
    const void * packed = specserve_q8_lanes_weights(src0);
    if (!packed) {
        return false;
    }
    const int64_t n_a = src1->ne[1], nb = src0->ne[0] / SPECSERVE_QK8_0, groups = src0->ne[1] / SPECSERVE_LANES;
    const size_t dst_stride = dst->nb[1] / sizeof(float);
    if (params->ith == 0) {
        atomic_fetch_add_explicit(&specserve_lanes_calls, 1, memory_order_relaxed);
    }
    if (n_a <= A_CHUNK) {
        void * act = act_for(params, src1, (const float *)src1->data, n_a, nb);
        const int64_t g0 = params->ith * groups / params->nth, g1 = (params->ith + 1) * groups / params->nth;
        specserve_q8_lanes_matmul(packed, g0, g1 - g0, nb, act, n_a, 0, n_a, (float *)dst->data, dst_stride);
        return true;
    }
    const int64_t c0 = params->ith * n_a / params->nth, c1 = (params->ith + 1) * n_a / params->nth;
    if (c1 > c0) {
        void * act = act_for(params, src1, (const float *)((const char *)src1->data + c0 * src1->nb[1]), c1 - c0, nb);
        specserve_q8_lanes_matmul(packed, 0, groups, nb, act, c1 - c0, 0, c1 - c0, (float *)dst->data + c0 * dst_stride,
                                  dst_stride);
    }
    return true;
}

bool specserve_q8_0_mul_mat(const struct ggml_compute_params * params, const struct ggml_tensor * dst,
                            const void * a, size_t a_row_bytes) {
    const struct ggml_tensor * src0 = dst->src[0];
    const struct ggml_tensor * src1 = dst->src[1];
    if (!takes(dst)) {
        return false;
    }
    // every thread asks; the first to come makes the copy while the others wait (lanes_weights.cpp)
    const void * packed = specserve_q8_lanes_weights(src0);
    if (packed) {
        lanes_mul_mat(params, dst, packed, a, a_row_bytes);
        return true;
    }
    const int64_t n_w = src0->ne[1], n_a = src1->ne[1], nb = src0->ne[0] / SPECSERVE_QK8_0;
    const size_t dst_stride = dst->nb[1] / sizeof(float);
    const int64_t w_chunk = weight_chunk(n_w, params->nth, 4);
    const int64_t w_chunks = (n_w + w_chunk - 1) / w_chunk, a_chunks = (n_a + A_CHUNK - 1) / A_CHUNK;
    const int64_t chunks = w_chunks * a_chunks;
    if (params->ith == 0) {
        atomic_fetch_add_explicit(&specserve_calls, 1, memory_order_relaxed);
    }
    // the activations' scales laid out once per call (each thread its own copy: no barrier)
    float * act = (float *)thread_buffer(specserve_q8_0_act_scales_size(n_a, nb) * sizeof(float));
    specserve_q8_0_act_scales(a, a_row_bytes, n_a, nb, act);
    // ggml_compute_forward_mul_mat set the shared counter to nth before the barrier: every
    // thread starts at its own index, then takes the next free chunk.
    for (int64_t chunk = params->ith; chunk < chunks; chunk = ggml_threadpool_chunk_add(params->threadpool, 1)) {
        const int64_t ca = chunk / w_chunks, cw = chunk % w_chunks;  // weight chunks vary fastest: activations stay hot
        const int64_t r0 = cw * w_chunk, c0 = ca * A_CHUNK;
        const int64_t nr = n_w - r0 < w_chunk ? n_w - r0 : w_chunk;
        const int64_t nc = n_a - c0 < A_CHUNK ? n_a - c0 : A_CHUNK;
        specserve_q8_0_matmul_scaled((const char *)src0->data + r0 * src0->nb[1], src0->nb[1], nr,
                                     (const char *)a + c0 * a_row_bytes, a_row_bytes, nc, nb,
                                     specserve_q8_0_act_scales_from(act, c0, nb), (float *)dst->data + c0 * dst_stride + r0, dst_stride);
    }
    return true;
}
