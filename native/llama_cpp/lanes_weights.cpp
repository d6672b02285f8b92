// The rows-in-lanes copies of a model's Q8_0 weight matrices (q8_lanes.h), for ggml_hook.c.
//
// A matrix is repacked the first time a matmul reads it (the engine's warm-up does all of them
// before it serves: docs/architecture.md, Memory), by whichever thread comes first while the
// others wait, and the copy lives as long as the ggml buffer that holds the weights: the buffer's
// free_buffer is wrapped so that freeing a model frees its copies too, and a later model whose
// weights land at the same address is never served a stale copy.
//
// Only matrices in a buffer llama.cpp marks as weights are taken: their contents do not change
// after loading (a KV cache, which changes every step, never is). The original stays where it
// was, for every other op that reads it (get_rows of tied embeddings) and for the stock kernels
// when ours are switched off; its pages are advised out (MADV_PAGEOUT: file-backed pages of an
// mmapped model are dropped and read back if touched; anonymous ones stay unless there is swap),
// so the copy costs little resident memory on top of the model.
#include "ggml-backend-impl.h"
#include "ggml-impl.h"
#include "q8_lanes.h"
#include "specserve.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace {

struct lanes_copy {
    void * packed;
    ggml_backend_buffer_t buffer;
    int64_t ne0, ne1;
};

std::mutex registry_mutex;
std::unordered_map<const void *, lanes_copy> copies;                        // by the weights' data
std::unordered_map<ggml_backend_buffer_t, void (*)(ggml_backend_buffer_t)> wrapped;  // their free_buffer

std::atomic<int> lanes_on{-1};  // -1: not read yet (SPECSERVE_Q8_LANES=0 starts it off)
std::atomic<long long> packed_bytes{0};

// Every thread asks for every matrix of every product (~210 a step each): under the registry's
// mutex the two threads met there several times a step and slept on it (a futex wait and wake,
// ~130 context switches a step). So each thread remembers what it was answered, valid while the
// registry's generation (bumped under the mutex whenever a copy is made or freed) is unchanged.
std::atomic<unsigned long long> generation{1};
std::atomic<long long> locked_lookups{0};  // lookups that took the mutex (tests: none once warm)

struct remembered {
    unsigned long long generation;
    const void * data;
    ggml_backend_buffer_t buffer;
    int64_t ne0, ne1;
    const void * packed;
};
constexpr size_t REMEMBERED = 1024, PROBES = 16;  // by address, probed linearly: a model's few hundred matrices
thread_local remembered answers[REMEMBERED];

// The entry remembered for w's data, else the one to remember it in (stale or free, else the first).
remembered & answer_for(const ggml_tensor * w, unsigned long long now) {
    const uintptr_t a = (uintptr_t)w->data;
    const size_t home = (size_t)((a >> 6) * 0x9E3779B97F4A7C15ull >> 54);  // 10 bits of a multiplicative hash
    remembered * vacant = nullptr;
    for (size_t i = 0; i < PROBES; ++i) {
        remembered & r = answers[(home + i) % REMEMBERED];
        if (r.data == w->data) return r;
        if (!vacant && r.generation != now) vacant = &r;
    }
    return vacant ? *vacant : answers[home % REMEMBERED];
}

void free_copies(ggml_backend_buffer_t buffer) {
    void (*original)(ggml_backend_buffer_t) = nullptr;
    {
        std::lock_guard<std::mutex> lock(registry_mutex);
        auto it = wrapped.find(buffer);
        if (it != wrapped.end()) {
            original = it->second;
            wrapped.erase(it);
        }
        for (auto c = copies.begin(); c != copies.end();) {
            if (c->second.buffer == buffer) {
                generation.fetch_add(1, std::memory_order_release);
                packed_bytes -= (long long)specserve_q8_lanes_size(c->second.ne1, c->second.ne0 / SPECSERVE_QK8_0);
                free(c->second.packed);
                c = copies.erase(c);
            } else {
                ++c;
            }
        }
    }
    if (original) {
        original(buffer);
    }
}

bool eligible(const ggml_tensor * w) {
    return w->type == GGML_TYPE_Q8_0 && w->view_src == nullptr && w->buffer != nullptr &&
           ggml_backend_buffer_get_usage(w->buffer) == GGML_BACKEND_BUFFER_USAGE_WEIGHTS &&
           w->ne[2] == 1 && w->ne[3] == 1 && w->ne[0] % SPECSERVE_QK8_0 == 0 && w->ne[1] % SPECSERVE_LANES == 0 &&
           w->nb[1] == ggml_row_size(GGML_TYPE_Q8_0, w->ne[0]);
}

// The original's whole pages, advised out now that the copy serves the matmuls.
void page_out(const void * data, size_t size) {
#ifdef MADV_PAGEOUT
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t first = ((uintptr_t)data + page - 1) & ~(page - 1), last = ((uintptr_t)data + size) & ~(page - 1);
    if (last > first) {
        madvise((void *)first, last - first, MADV_PAGEOUT);  // advice: a failure changes nothing
    }
#else
    (void)data, (void)size;
#endif
}

}  // namespace

extern "C" int specserve_q8_lanes_enabled(void) {
    int on = lanes_on.load(std::memory_order_relaxed);
    if (on < 0) {
        const char * env = getenv("SPECSERVE_Q8_LANES");
        on = !(env && env[0] == '0' && env[1] == '\0') && specserve_q8_lanes_compiled();
        lanes_on.store(on, std::memory_order_relaxed);
    }
    return on;
}

extern "C" void specserve_q8_lanes_set_enabled(int on) {
    lanes_on.store(on && specserve_q8_lanes_compiled() ? 1 : 0, std::memory_order_relaxed);
}

extern "C" long long specserve_q8_lanes_locked_lookups(void) {
    return locked_lookups.load(std::memory_order_relaxed);
}

extern "C" long long specserve_q8_lanes_bytes(void) {
    return packed_bytes.load(std::memory_order_relaxed);
}

extern "C" const void * specserve_q8_lanes_weights(const struct ggml_tensor * w) {
    if (!specserve_q8_lanes_enabled() || !eligible(w)) {
        return nullptr;
    }
    const unsigned long long now = generation.load(std::memory_order_acquire);
    remembered & seen = answer_for(w, now);
    if (seen.generation == now && seen.data == w->data && seen.buffer == w->buffer &&
        seen.ne0 == w->ne[0] && seen.ne1 == w->ne[1]) {
        return seen.packed;
    }
    std::lock_guard<std::mutex> lock(registry_mutex);
    locked_lookups.fetch_add(1, std::memory_order_relaxed);
    auto it = copies.find(w->data);
    if (it != copies.end() && it->second.buffer == w->buffer && it->second.ne0 == w->ne[0] && it->second.ne1 == w->ne[1]) {
        seen = remembered{generation.load(std::memory_order_relaxed), w->data, w->buffer, w->ne[0], w->ne[1], it->second.packed};
        return it->second.packed;
    }
    const int64_t nb = w->ne[0] / SPECSERVE_QK8_0;
    const size_t size = specserve_q8_lanes_size(w->ne[1], nb);
    void * packed = aligned_alloc(64, (size + 63) & ~(size_t)63);
    if (packed == nullptr) {
        return nullptr;  // no memory for a copy: the stock-order kernels serve this matrix
    }
    specserve_q8_lanes_pack(w->data, w->nb[1], w->ne[1], nb, packed);
    if (it != copies.end()) {  // another matrix at this address (cannot outlive its buffer, but be sure)
        free(it->second.packed);
        packed_bytes -= (long long)specserve_q8_lanes_size(it->second.ne1, it->second.ne0 / SPECSERVE_QK8_0);
    }
    generation.fetch_add(1, std::memory_order_release);
    copies[w->data] = lanes_copy{packed, w->buffer, w->ne[0], w->ne[1]};
    packed_bytes += (long long)size;
    if (wrapped.find(w->buffer) == wrapped.end()) {
        wrapped[w->buffer] = w->buffer->iface.free_buffer;
        w->buffer->iface.free_buffer = free_copies;
    }
    page_out(w->data, ggml_nbytes(w));
    return packed;
}
