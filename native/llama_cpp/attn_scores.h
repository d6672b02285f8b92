// specserve: attention scores over a Q8_0 KV cache with the queries in SIMD lanes, for the
// rows-in-lanes arithmetic's attention (attn_two_pass.cpp).
//
// llama.cpp's order (q8_matmul.h) keeps 8 int32 partial sums per query and key block and adds
// them horizontally at the end: at a verification's 12-24 queries per KV head that horizontal
// work, not the products, is most of attention's cost (docs/results.md, session 36). Here 16
// queries sit in the 16 int32 lanes of a register, so one vpdpbusd multiplies 4 bytes of a key
// (broadcast) with 4 bytes of each of 16 queries, and one convert, one scale product and one fma
// finish a block for all of them. The keys are read from the cache as they are (each byte
// offset by 128 into a scratch copy: vpdpbusd multiplies unsigned by signed bytes); nothing is
// laid out per key but that copy.
//
// The arithmetic of one score (query q, key k, nb blocks of 32), the rows-in-lanes matmul's own
// (q8_lanes.h):
//   acc = 0
//   for each block b:
//     s   = sum of q.qs[i] * k.qs[i], i = 0..31                    (exact, int32)
//     acc = fma(fp32(q[b].d) * fp32(k[b].d), float(s), acc)
//   score = acc
// It depends on the query and the key only: not on the lane, the other queries, the number of
// keys or how the work is split, so a query's scores are the same alone and in any batch.
//
// No ggml header: tests/native/test_attn_scores.py compiles it on its own.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// scores[i * pad + k] = score(query i, key k) for i < nq, k < n_keys; k in [n_keys, pad) gets
// finite filler (pad >= n_keys rounded up to 16). Queries: Q8_0 rows q_row bytes apart; keys:
// Q8_0 rows k_row_bytes apart; nb blocks of 32 each.
void specserve_attn_scores(const void * k_rows, size_t k_row_bytes, int64_t n_keys, const void * q8, size_t q_row,
                           int64_t nq, int64_t nb, float * scores, size_t pad);

// The same score by score in plain C: the specification the SIMD path must match bit for bit.
void specserve_attn_scores_ref(const void * k_rows, size_t k_row_bytes, int64_t n_keys, const void * q8, size_t q_row,
                               int64_t nq, int64_t nb, float * scores, size_t pad);

// 1 where the SIMD path is compiled (AVX-512 with VNNI), else 0 (the call then runs the plain C).
int specserve_attn_scores_compiled(void);

#ifdef __cplusplus
}
#endif
