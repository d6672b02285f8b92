// What a weight format with coarser scales than Q8_0's would buy a verification step: the served
// model's matmuls (SmolLM2-135M: 30 layers x 7 matrices + the output matrix) for t activation rows,
// two threads each taking half of every matrix's rows with a barrier between matrices, as
// llama.cpp's graph runs them, weights read from memory (all 143 MB a step, as in serving).
// bench/bench_coarse_scales.py compiles it with the product's kernel and prints the ratios.
//
// Variants (random weights and activations; the arithmetic, not the numbers, is measured):
//   q8_0        the product's lanes kernel on Q8_0 (a scale every 32 weights, weight and
//               activation): 8 vpdpbusd, then convert + scale product + fma, every block.
//   row_vnni    one scale a weight row and one an activation row: the same vpdpbusd on the same
//               bytes, int32 sums across the whole row, one convert and scale at the end.
//   row_amx     the same format on Intel AMX: 64-deep int8 tiles accumulate the whole row in
//               the tile; one store and scale at the end.
//   b192_amx    a scale every 192 weights (3 tiles deep; 576 and 1536, the model's depths, are
//               multiples of 192, not of 128), then the sums leave the tiles and their scales
//               apply: a sixth of Q8_0's epilogues.
// Each prototype is checked against a plain reference of its own arithmetic before timing.
//
//   coarse_scales ROUNDS STEPS  ->  one JSON line: ms a step per variant and t (min over rounds
//   of the median of STEPS steps), and "amx": whether the CPU granted AMX tiles.
#include "q8_lanes.h"
#include "q8_matmul.h"

#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int LANES = SPECSERVE_LANES;  // weight rows a group
constexpr int QK = SPECSERVE_QK8_0;
constexpr int MAX_T = 16;

struct matrix {
    int64_t n_w, k;                    // rows (outputs), depth
    std::vector<uint8_t> lanes;        // q8_0: the product's packed layout
    std::vector<uint8_t> quants_vnni;  // row_vnni: [group][block][8 slices x 16 rows x 4], w + 128
    std::vector<int8_t> tiles;         // *_amx: [group][k/64][16 quads x 16 rows x 4]
    std::vector<float> row_scale;      // [n_w]
    std::vector<uint16_t> scale192;    // [group][k/192][16] half
};

void * aligned(size_t bytes) {
    void * p = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (!p) { std::fprintf(stderr, "out of memory\n"); std::exit(1); }
    return p;
}

uint16_t to_half(float f) { return _cvtss_sh(f, 0); }

matrix make_matrix(int64_t n_w, int64_t k, std::mt19937 & rng) {
    matrix m{n_w, k, {}, {}, {}, {}, {}};
    const int64_t nb = k / QK, groups = n_w / LANES;
    std::uniform_int_distribution<int> q(-127, 127);
    std::uniform_real_distribution<float> s(0.001f, 0.01f);
    std::vector<specserve_block_q8_0> rows(n_w * nb);
    for (auto & b : rows) {
        b.d = to_half(s(rng));
        for (auto & x : b.qs) x = (int8_t)q(rng);
    }
    m.lanes.resize(specserve_q8_lanes_size(n_w, nb));
    specserve_q8_lanes_pack(rows.data(), nb * sizeof(specserve_block_q8_0), n_w, nb, m.lanes.data());
    m.quants_vnni.resize(groups * nb * 512);
    m.tiles.resize(n_w * k);
    for (int64_t g = 0; g < groups; ++g) {
        for (int64_t b = 0; b < nb; ++b) {
            for (int sl = 0; sl < 8; ++sl) {
                for (int l = 0; l < LANES; ++l) {
                    for (int i = 0; i < 4; ++i) {
                        const int8_t w = rows[(g * LANES + l) * nb + b].qs[4 * sl + i];
                        m.quants_vnni[(g * nb + b) * 512 + sl * 64 + l * 4 + i] = (uint8_t)(w ^ 0x80);
                        const int64_t kk = b * QK + 4 * sl + i;  // depth index
                        m.tiles[((g * (k / 64) + kk / 64) * 16 + (kk % 64) / 4) * 64 + l * 4 + kk % 4] = w;
                    }
                }
            }
        }
    }
    m.row_scale.resize(n_w);
    for (auto & x : m.row_scale) x = s(rng);
    m.scale192.resize(groups * (k / 192) * LANES);
    for (auto & x : m.scale192) x = to_half(s(rng));
    return m;
}

// Activations: t rows in each variant's layout.
struct acts {
    int64_t k;
    std::vector<specserve_block_q8_0> q8;  // q8_0: ggml's rows
    void * lanes = nullptr;                // q8_0: the kernel's layout
    std::vector<int8_t> rows;              // row_*: [t][k]
    std::vector<int32_t> negcorr;          // row_vnni: -128 x the row's quant sum
    std::vector<float> scale;              // [t]
    std::vector<float> scale192;           // [t][k/192]
};

acts make_acts(int64_t k, int t, std::mt19937 & rng) {
    acts a;
    a.k = k;
    const int64_t nb = k / QK;
    std::uniform_int_distribution<int> q(-127, 127);
    std::uniform_real_distribution<float> s(0.01f, 0.1f);
    a.q8.resize(t * nb);
    for (auto & b : a.q8) {
        b.d = to_half(s(rng));
        for (auto & x : b.qs) x = (int8_t)q(rng);
    }
    a.lanes = aligned(specserve_q8_lanes_act_size(t, nb));
    specserve_q8_lanes_act(a.q8.data(), nb * sizeof(specserve_block_q8_0), t, nb, a.lanes);
    a.rows.resize(t * k);
    a.negcorr.assign(t, 0);
    for (int r = 0; r < t; ++r) {
        for (int64_t i = 0; i < k; ++i) {
            a.rows[r * k + i] = a.q8[r * nb + i / QK].qs[i % QK];
            a.negcorr[r] -= 128 * a.rows[r * k + i];
        }
    }
    a.scale.resize(t);
    for (auto & x : a.scale) x = s(rng);
    a.scale192.resize(t * (k / 192));
    for (auto & x : a.scale192) x = s(rng);
    return a;
}

constexpr size_t PF_L2 = 32768, PF_L1 = 2048;  // the product kernel's distances

// ---- row_vnni: two groups in turn (as the product's group_pair), int32 sums across the row ----
// Up to 4 rows, each sum in two chains (the vpdpbusd latency); more rows are chains enough.
// rows: P activation rows k bytes apart; negcorr, scale: theirs.
template <int P>
void row_vnni_pair(const matrix & m, int64_t g, const int8_t * rows, const int32_t * negcorr, const float * scale,
                   float * dst, size_t stride) {
    const int64_t nb = m.k / QK;
    const uint8_t * qa = m.quants_vnni.data() + g * nb * 512, * qb = qa + nb * 512;
    __m512i sa0[P], sa1[P], sb0[P], sb1[P];
#pragma GCC unroll 8
    for (int i = 0; i < P; ++i) {
        sa0[i] = sb0[i] = _mm512_set1_epi32(negcorr[i]);
        sa1[i] = sb1[i] = _mm512_setzero_si512();
    }
    for (int64_t b = 0; b < nb; ++b) {
        for (int s = 0; s < 8; ++s) {
            _mm_prefetch((const char *)qa + b * 512 + s * 64 + PF_L2, _MM_HINT_T1);
            _mm_prefetch((const char *)qa + b * 512 + s * 64 + PF_L1, _MM_HINT_T0);
        }
        for (int s = 0; s < 8; ++s) {
            _mm_prefetch((const char *)qb + b * 512 + s * 64 + PF_L2, _MM_HINT_T1);
            _mm_prefetch((const char *)qb + b * 512 + s * 64 + PF_L1, _MM_HINT_T0);
        }
#pragma GCC unroll 8
        for (int s = 0; s < 8; ++s) {
            const __m512i wa = _mm512_loadu_si512(qa + b * 512 + s * 64), wb = _mm512_loadu_si512(qb + b * 512 + s * 64);
#pragma GCC unroll 8
            for (int i = 0; i < P; ++i) {
                int32_t slice;
                std::memcpy(&slice, rows + i * m.k + b * QK + 4 * s, 4);
                const __m512i x = _mm512_set1_epi32(slice);
                if (P <= 4 && (s & 1)) { sa1[i] = _mm512_dpbusd_epi32(sa1[i], wa, x); sb1[i] = _mm512_dpbusd_epi32(sb1[i], wb, x); }
                else { sa0[i] = _mm512_dpbusd_epi32(sa0[i], wa, x); sb0[i] = _mm512_dpbusd_epi32(sb0[i], wb, x); }
            }
        }
    }
    const __m512 wsa = _mm512_loadu_ps(m.row_scale.data() + g * LANES), wsb = _mm512_loadu_ps(m.row_scale.data() + (g + 1) * LANES);
    for (int i = 0; i < P; ++i) {
        const __m512 as = _mm512_set1_ps(scale[i]);
        _mm512_storeu_ps(dst + i * stride + g * LANES,
                         _mm512_mul_ps(_mm512_mul_ps(wsa, as), _mm512_cvtepi32_ps(_mm512_add_epi32(sa0[i], sa1[i]))));
        _mm512_storeu_ps(dst + i * stride + (g + 1) * LANES,
                         _mm512_mul_ps(_mm512_mul_ps(wsb, as), _mm512_cvtepi32_ps(_mm512_add_epi32(sb0[i], sb1[i]))));
    }
}

template <int P>
void row_vnni_range(const matrix & m, int64_t g0, int64_t g1, const acts & a, int r0, float * dst, size_t stride) {
    for (int64_t g = g0; g + 1 < g1; g += 2) {
        row_vnni_pair<P>(m, g, a.rows.data() + r0 * a.k, a.negcorr.data() + r0, a.scale.data() + r0, dst + r0 * stride, stride);
    }
}

// ---- AMX ----
struct alignas(64) tile_config {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
};

bool amx_granted() {
    constexpr long ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18;
    return __builtin_cpu_supports("amx-int8") && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

// tiles: 0, 1 the two groups' sums (t x 16 int32), 2 the activations (t x 64 bytes), 3, 4 the
// two groups' weights (16 quads x 16 rows x 4 bytes)
__attribute__((target("amx-tile"))) void amx_configure(int t) {
    tile_config c;
    for (int i : {0, 1, 2}) { c.rows[i] = (uint8_t)t; c.colsb[i] = 64; }
    for (int i : {3, 4}) { c.rows[i] = 16; c.colsb[i] = 64; }
    __asm__ volatile("" : : "r"(&c) : "memory");  // GCC's ldtilecfg reads only the first bytes otherwise: keep the stores
    _tile_loadconfig(&c);
}

__attribute__((target("amx-tile"))) void amx_release() { _tile_release(); }

inline void prefetch_tiles(const int8_t * w) {
    for (int l = 0; l < 16; ++l) {
        _mm_prefetch((const char *)w + l * 64 + PF_L2, _MM_HINT_T1);
        _mm_prefetch((const char *)w + l * 64 + PF_L1, _MM_HINT_T0);
    }
}

// Two groups' exact int32 sums over the 64-deep chunks [c0, c1) of their rows, into sums[group][row].
__attribute__((target("amx-tile,amx-int8"))) inline void amx_sums(const int8_t * wa, const int8_t * wb, const acts & a,
                                                                  int64_t c0, int64_t c1, int32_t (*sums)[MAX_T][16]) {
    _tile_zero(0);
    _tile_zero(1);
    for (int64_t c = c0; c < c1; ++c) {
        prefetch_tiles(wa + c * 1024);
        prefetch_tiles(wb + c * 1024);
        _tile_loadd(2, a.rows.data() + c * 64, a.k);
        _tile_loadd(3, wa + c * 1024, 64);
        _tile_loadd(4, wb + c * 1024, 64);
        _tile_dpbssd(0, 2, 3);
        _tile_dpbssd(1, 2, 4);
    }
    _tile_stored(0, sums[0], 64);
    _tile_stored(1, sums[1], 64);
}

__attribute__((target("amx-tile,amx-int8,avx512f"))) void row_amx_pair(const matrix & m, int64_t g, const acts & a, int t,
                                                                        float * dst, size_t stride) {
    const int64_t kc = m.k / 64;
    const int8_t * wa = m.tiles.data() + g * kc * 1024, * wb = wa + kc * 1024;
    alignas(64) int32_t sums[2][MAX_T][16];
    amx_sums(wa, wb, a, 0, kc, sums);
    for (int h = 0; h < 2; ++h) {
        const __m512 ws = _mm512_loadu_ps(m.row_scale.data() + (g + h) * LANES);
        for (int i = 0; i < t; ++i) {
            const __m512 s = _mm512_cvtepi32_ps(_mm512_load_si512(sums[h][i]));
            _mm512_storeu_ps(dst + i * stride + (g + h) * LANES, _mm512_mul_ps(_mm512_mul_ps(ws, _mm512_set1_ps(a.scale[i])), s));
        }
    }
}

__attribute__((target("amx-tile,amx-int8,avx512f,f16c"))) void b192_amx_pair(const matrix & m, int64_t g, const acts & a,
                                                                               int t, float * dst, size_t stride) {
    const int64_t kc = m.k / 64, segs = m.k / 192;
    const int8_t * wa = m.tiles.data() + g * kc * 1024, * wb = wa + kc * 1024;
    __m512 acc[2][MAX_T];
    for (int h = 0; h < 2; ++h) for (int i = 0; i < t; ++i) acc[h][i] = _mm512_setzero_ps();
    alignas(64) int32_t sums[2][MAX_T][16];
    for (int64_t sg = 0; sg < segs; ++sg) {
        amx_sums(wa, wb, a, 3 * sg, 3 * sg + 3, sums);
        for (int h = 0; h < 2; ++h) {
            const __m512 ws = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(m.scale192.data() + ((g + h) * segs + sg) * LANES)));
            for (int i = 0; i < t; ++i) {
                const __m512 d = _mm512_mul_ps(ws, _mm512_set1_ps(a.scale192[i * segs + sg]));
                acc[h][i] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_load_si512(sums[h][i])), acc[h][i]);
            }
        }
    }
    for (int h = 0; h < 2; ++h)
        for (int i = 0; i < t; ++i) _mm512_storeu_ps(dst + i * stride + (g + h) * LANES, acc[h][i]);
}

enum variant { Q8_0, ROW_VNNI, ROW_AMX, B192_AMX, VARIANTS };
const char * NAMES[VARIANTS] = {"q8_0", "row_vnni", "row_amx", "b192_amx"};

// Groups [g0, g1) of m against t rows (g0, g1 even).
void product(variant v, const matrix & m, int64_t g0, int64_t g1, const acts & a, int t, float * dst, size_t stride) {
    switch (v) {
        case Q8_0:
            specserve_q8_lanes_matmul(m.lanes.data(), g0, g1 - g0, m.k / QK, a.lanes, t, 0, t, dst, stride);
            break;
        case ROW_VNNI:
            for (int r0 = 0; r0 < t; r0 += 8) {  // tiles of 8 rows, as the product's kernel
                switch (std::min(8, t - r0)) {
                    case 8: row_vnni_range<8>(m, g0, g1, a, r0, dst, stride); break;
                    case 4: row_vnni_range<4>(m, g0, g1, a, r0, dst, stride); break;
                    case 2: row_vnni_range<2>(m, g0, g1, a, r0, dst, stride); break;
                    default: row_vnni_range<1>(m, g0, g1, a, r0, dst, stride); break;
                }
            }
            break;
        case ROW_AMX:
            for (int64_t g = g0; g + 1 < g1; g += 2) row_amx_pair(m, g, a, t, dst, stride);
            break;
        case B192_AMX:
            for (int64_t g = g0; g + 1 < g1; g += 2) b192_amx_pair(m, g, a, t, dst, stride);
            break;
        default:
            break;
    }
}

// Plain references of each prototype's arithmetic (the product's is tested in tests/native).
float ref_row(const matrix & m, int64_t w, const acts & a, int r) {
    int64_t s = 0;
    const int64_t nb = m.k / QK;
    for (int64_t k = 0; k < m.k; ++k) {
        const int g = (int)(w / LANES), l = (int)(w % LANES);
        const int8_t q = (int8_t)(m.quants_vnni[(g * nb + k / QK) * 512 + ((k % QK) / 4) * 64 + l * 4 + k % 4] ^ 0x80);
        s += (int64_t)q * a.rows[r * a.k + k];
    }
    return (float)s * m.row_scale[w] * a.scale[r];
}

float ref_b192(const matrix & m, int64_t w, const acts & a, int r) {
    const int64_t nb = m.k / QK, segs = m.k / 192;
    double acc = 0;
    for (int64_t sg = 0; sg < segs; ++sg) {
        int64_t s = 0;
        for (int64_t k = sg * 192; k < sg * 192 + 192; ++k) {
            const int g = (int)(w / LANES), l = (int)(w % LANES);
            const int8_t q = (int8_t)(m.quants_vnni[(g * nb + k / QK) * 512 + ((k % QK) / 4) * 64 + l * 4 + k % 4] ^ 0x80);
            s += (int64_t)q * a.rows[r * a.k + k];
        }
        acc += (double)s * _cvtsh_ss(m.scale192[((w / LANES) * segs + sg) * LANES + w % LANES]) * a.scale192[r * segs + sg];
    }
    return (float)acc;
}

double now_ms() {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char ** argv) {
    const int rounds = argc > 1 ? std::atoi(argv[1]) : 3, steps = argc > 2 ? std::atoi(argv[2]) : 15;
    const bool amx = amx_granted();
    std::mt19937 rng(7);
    // the served model's matrices: per layer Q, K, V, O, gate, up, down; then the output matrix
    std::vector<matrix> mats;
    for (int layer = 0; layer < 30; ++layer) {
        for (auto [n_w, k] : {std::pair<int64_t, int64_t>{576, 576}, {192, 576}, {192, 576}, {576, 576}, {1536, 576},
                              {1536, 576}, {576, 1536}}) {
            mats.push_back(make_matrix(n_w, k, rng));
        }
    }
    mats.push_back(make_matrix(49152, 576, rng));
    size_t q8_bytes = 0;
    for (auto & m : mats) q8_bytes += m.lanes.size();
    const std::vector<int> ts = {1, 2, 4, 8, 16};
    std::vector<acts> a576, a1536;
    for (int t : ts) { a576.push_back(make_acts(576, t, rng)); a1536.push_back(make_acts(1536, t, rng)); }
    std::vector<float> out((size_t)MAX_T * 49152);

    // the prototypes against their references: a 576-deep and a 1536-deep matrix, t = 8
    double worst = 0;
    for (variant v : {ROW_VNNI, ROW_AMX, B192_AMX}) {
        if (v != ROW_VNNI && !amx) continue;
        for (const matrix * m : {&mats[0], &mats[6]}) {
            const acts & a = m->k == 576 ? a576[3] : a1536[3];
            if (v != ROW_VNNI) amx_configure(8);
            product(v, *m, 0, m->n_w / LANES, a, 8, out.data(), m->n_w);
            for (int r = 0; r < 8; ++r) {
                for (int64_t w = 0; w < m->n_w; w += 37) {
                    const float want = v == B192_AMX ? ref_b192(*m, w, a, r) : ref_row(*m, w, a, r);
                    worst = std::max(worst, (double)std::fabs(out[r * m->n_w + w] - want) / (std::fabs(want) + 1e-3));
                }
            }
        }
    }
    if (worst > 1e-4) { std::fprintf(stderr, "prototype differs from its reference: %g\n", worst); return 1; }

    std::vector<std::vector<double>> best(VARIANTS, std::vector<double>(ts.size(), 1e30));
    for (int round = 0; round < rounds; ++round) {
        for (size_t ti = 0; ti < ts.size(); ++ti) {
            for (int vi = 0; vi < VARIANTS; ++vi) {
                const variant v = (variant)vi;
                if ((v == ROW_AMX || v == B192_AMX) && !amx) continue;
                const int t = ts[ti];
                std::vector<double> times;
#pragma omp parallel num_threads(2)
                {
                    const int ith = omp_get_thread_num(), nth = omp_get_num_threads();
                    if (v == ROW_AMX || v == B192_AMX) amx_configure(t);
                    for (int s = 0; s < steps + 2; ++s) {
                        const double t0 = now_ms();
                        for (auto & m : mats) {
                            const int64_t groups = m.n_w / LANES;
                            const int64_t g0 = ith * groups / nth / 2 * 2, g1 = ith + 1 == nth ? groups : (ith + 1) * groups / nth / 2 * 2;
                            product(v, m, g0, g1, m.k == 576 ? a576[ti] : a1536[ti], t, out.data(), m.n_w);
#pragma omp barrier
                        }
                        if (ith == 0 && s >= 2) times.push_back(now_ms() - t0);
                    }
                    if (v == ROW_AMX || v == B192_AMX) amx_release();
                }
                std::sort(times.begin(), times.end());
                best[vi][ti] = std::min(best[vi][ti], times[times.size() / 2]);
            }
        }
    }
    std::printf("{\"amx\": %s, \"weight_bytes_q8_0\": %zu, \"worst_rel_diff\": %.3g, \"t\": [", amx ? "true" : "false", q8_bytes, worst);
    for (size_t i = 0; i < ts.size(); ++i) std::printf("%s%d", i ? ", " : "", ts[i]);
    std::printf("], \"ms\": {");
    for (int vi = 0; vi < VARIANTS; ++vi) {
        if ((vi == ROW_AMX || vi == B192_AMX) && !amx) continue;
        std::printf("%s\"%s\": [", vi ? ", " : "", NAMES[vi]);
        for (size_t i = 0; i < ts.size(); ++i) std::printf("%s%.3f", i ? ", " : "", best[vi][i]);
        std::printf("]");
    }
    std::printf("}}\n");
    return 0;
}
