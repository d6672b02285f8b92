// specserve: attention scores over a Q8_0 KV cache, for the rows-in-lanes arithmetic's attention
// (attn_two_pass.cpp), made by the rows-in-lanes matmul itself (q8_lanes.h): each group of 16 keys
// is packed as one of its weight groups (transposed in registers, offset to unsigned bytes), the
// queries are its activation rows, and one call makes every score.
//
// Why keys, not queries, in the lanes: decoding, a KV head has only its query heads' queries (3
// for the served model), and with the queries in a register's 16 lanes 13 lanes idled; 16 keys
// fill a register whatever the number of queries. Hot, one thread, 256 keys: 3 queries 7.1 k ->
// 2.3 k TSC cycles a call, 24 queries 13.6 k -> 7.7 k, 384 queries 274 k -> 148 k (session 41).
//
// The arithmetic of one score (query q, key k, nb blocks of 32), the rows-in-lanes matmul's own
// with the key as its weight row:
//   acc = 0
//   for each block b:
//     s   = sum of q.qs[i] * k.qs[i], i = 0..31                    (exact, int32)
//     acc = fma(fp32(k[b].d) * fp32(q[b].d), float(s), acc)
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
