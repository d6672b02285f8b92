// specserve's fast Walsh-Hadamard transform of fp32 rows: llama.cpp rotates attention's queries,
// keys and outputs with it when the KV cache is quantized (GGML_HINT_SRC0_IS_HADAMARD), ~190 rows
// of 64 a layer and token. ggml's own code runs the butterflies of the first four levels (pairs
// 1 to 8 apart) one float at a time: 0.9 ms of a 20 ms verification step of 8 tokens on a 2-core
// Xeon. Here those levels run inside 512-bit registers (a swap of lanes, an add, a masked
// subtract), the rest as ggml does; every butterfly is the same u + v and u - v of the same two
// numbers, each rounded once, so the output is ggml's bit for bit (tests/native/test_fwht.py).
#pragma once

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// dst = FWHT(src * scale) for one row of n floats, n a power of 2 of at least 16; src and dst may
// be the same. Returns 0 (and writes nothing) where the SIMD path is not compiled or n does not fit.
int specserve_fwht_row(const float * src, float * dst, int64_t n, float scale);

// The same in plain C, in ggml's order: the specification.
void specserve_fwht_row_ref(const float * src, float * dst, int64_t n, float scale);

#ifdef __cplusplus
}
#endif
