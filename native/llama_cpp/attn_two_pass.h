// specserve: attention over a Q8_0 KV cache in the lanes arithmetic's own order (attn_hook.cpp
// calls it for a unit of queries when the rows-in-lanes matmul serves the model, q8_lanes.h).
//
// The stock kernel's online softmax is a serial chain per query and key (compare, maybe rescale
// the accumulator, one expf, one fma into the sum), and keeping its bits costs ~20 cycles a query
// and key on AVX-512 (docs/results.md, session 33). With the matmuls no longer in llama.cpp's
// order there is no stock bit left to keep, only batch invariance, so here each query takes three
// passes over its keys, each in a fixed order that depends on nothing but the query and its keys:
//   1. s_k = score_k * scale + mask_k, M = max_k s_k                  (a max is exact in any order)
//   2. p_k = exp(s_k - M) (0 where the mask hides the key), S = sum_k p_k: 16 lane sums (key k
//      in lane k % 16) added in a fixed tree
//   3. out = (sum over k in order of fma(v_k, p_k, acc)) * (1 / S)
// Keys a query may not see add exact zeros (x + 0, fma(v, 0, acc)), so how many keys the walk
// covers -- which depends on the other queries of the unit -- changes no bit of it.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "ggml.h"

namespace specserve {

// True where this build has the three passes (AVX-512) and the shapes fit (DV a multiple of 64).
bool two_pass_supported(int64_t dv);

// nq queries (Q8_0 rows q_row bytes apart in q8) against keys [0, n_keys) of one KV head:
// acc[i * dv ..] gets query i's unnormalised output and sum[i] its S (0: it sees no key). masks[i]:
// query i's mask row (or null). scores: room for nq x round_up(n_keys, 16) floats; vrows: 64 x dv.
void attend_two_pass(const char * k_rows, size_t k_row_bytes, const char * v_rows, size_t v_row_bytes,
                     int64_t n_keys, const char * q8, size_t q_row, int64_t nq, int64_t nb_dk, int64_t dv,
                     float scale, const ggml_fp16_t * const * masks, float * scores, float * vrows,
                     float * acc, float * sum);

}  // namespace specserve
