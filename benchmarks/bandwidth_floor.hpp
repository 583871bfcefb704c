#pragma once
// The host benchmarks' floor: the best memory bandwidth this machine shows, on the benchmark's threads,
// for a pass that streams once through arrays of a given total size. A fused step reads some arrays and
// reads and writes others, so no single kernel bounds it: an in-place triad alone was beaten by the
// fused pass itself (0.58-0.96x of it). So five kernels run over buffers of the pass's size, and the
// fastest sets the floor:
//   read             sum of a                          4 bytes an element
//   copy             b = a (memcpy)                    8
//   copy streaming   b = a, non-temporal stores         8
//   triad            a = a + s * b (in place)          12
//   triad streaming  c = a + s * b, non-temporal       12
// (a store that misses the cache also reads its line first; the counts leave that out, as the passes'
// byte counts do, and the streaming kernels avoid it). Sizes that fit in a cache get that cache's
// bandwidth, as the pass over them does (bandwidth_floors: which size's figure a pass gets).

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <towerpipe/towerpipe.hpp>

#include "bench_support.hpp"

namespace towerpipe_bench {

struct bandwidth_floor {
  struct kernel {
    std::string name;
    double bytes_per_second = 0;
  };
  std::vector<kernel> kernels;  // every kernel's figure, in the order above
  std::size_t bytes = 0;        // the buffers' total size measured

  const kernel& best() const {
    return *std::max_element(kernels.begin(), kernels.end(),
                             [](const kernel& a, const kernel& b) { return a.bytes_per_second < b.bytes_per_second; });
  }
};

namespace detail {

// Stores that bypass the cache where the CPU has them (SSE2: every x86-64), else plain ones. 16-byte
// aligned `to`; `n` a multiple of 4.
inline void stream_copy(float* to, const float* from, std::size_t n) {
#if defined(__SSE2__)
  for (std::size_t i = 0; i < n; i += 4) _mm_stream_ps(to + i, _mm_load_ps(from + i));
  _mm_sfence();
#else
  std::memcpy(to, from, n * sizeof(float));
#endif
}
inline void stream_triad(float* c, const float* a, const float* b, float s, std::size_t n) {
#if defined(__SSE2__)
  const __m128 scale = _mm_set1_ps(s);
  for (std::size_t i = 0; i < n; i += 4) _mm_stream_ps(c + i, _mm_add_ps(_mm_load_ps(a + i), _mm_mul_ps(scale, _mm_load_ps(b + i))));
  _mm_sfence();
#else
  for (std::size_t i = 0; i < n; ++i) c[i] = a[i] + s * b[i];
#endif
}
// Eight independent sums, so that the adds' latency does not bound the loads.
inline float read_sum(const float* a, std::size_t n) {
#if defined(__SSE2__)
  __m128 sum[8];
  for (__m128& s : sum) s = _mm_setzero_ps();
  for (std::size_t i = 0; i < n; i += 32) {
    for (int k = 0; k < 8; ++k) sum[k] = _mm_add_ps(sum[k], _mm_load_ps(a + i + 4 * k));
  }
  float lanes[4];
  for (int k = 1; k < 8; ++k) sum[0] = _mm_add_ps(sum[0], sum[k]);
  _mm_storeu_ps(lanes, sum[0]);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
#else
  float sum = 0;
  for (std::size_t i = 0; i < n; ++i) sum += a[i];
  return sum;
#endif
}

}  // namespace detail

// The five kernels over `bytes` of buffers on `threads` threads (each thread its own contiguous,
// 128-byte aligned part, first touched by it), the fastest of `repetitions` timed runs each after a
// warm-up run.
inline bandwidth_floor measure_bandwidth(std::size_t bytes, std::size_t threads, int repetitions) {
  constexpr std::size_t granule = 32;  // floats: what read_sum takes per iteration, a multiple of every kernel's
  towerpipe::detail::thread_pool pool(threads);
  const auto run = [&](std::size_t buffers, double bytes_per_element, auto&& body) {
    const std::size_t per_thread = std::max<std::size_t>(bytes / sizeof(float) / buffers / threads / granule, 1) * granule;
    std::vector<float*> parts(threads * buffers);
    std::vector<float> storage(per_thread * buffers * threads + granule);
    float* base = storage.data();
    while (reinterpret_cast<std::uintptr_t>(base) % 128 != 0) ++base;
    for (std::size_t i = 0; i < parts.size(); ++i) parts[i] = base + i * per_thread;
    pool.run(threads, [&](std::size_t t) {  // each thread's pages first touched by it, with values that stay finite
      for (std::size_t k = 0; k < buffers; ++k) std::fill_n(parts[t * buffers + k], per_thread, 1.0f / static_cast<float>(k + 2));
    });
    std::vector<float> sinks(threads);
    std::vector<double> seconds;
    for (int r = 0; r <= repetitions; ++r) {
      const auto start = std::chrono::steady_clock::now();
      pool.run(threads, [&](std::size_t t) { body(&parts[t * buffers], per_thread, sinks[t]); });
      if (r > 0) seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    volatile float keep = sinks[0];  // the read kernel's sums must be computed
    (void)keep;
    // The fastest run: the best the machine shows (another process taking a core only slows a run).
    return bytes_per_element * static_cast<double>(per_thread * threads) / *std::min_element(seconds.begin(), seconds.end());
  };
  bandwidth_floor f;
  f.bytes = bytes;
  f.kernels.push_back({"read", run(1, 4, [](float** p, std::size_t n, float& sink) { sink += detail::read_sum(p[0], n); })});
  f.kernels.push_back({"copy", run(2, 8, [](float** p, std::size_t n, float&) { std::memcpy(p[1], p[0], n * sizeof(float)); })});
  f.kernels.push_back(
      {"copy streaming", run(2, 8, [](float** p, std::size_t n, float&) { detail::stream_copy(p[1], p[0], n); })});
  f.kernels.push_back({"triad", run(2, 12, [](float** p, std::size_t n, float&) {
                         float* a = p[0];
                         const float* b = p[1];
                         for (std::size_t i = 0; i < n; ++i) a[i] = a[i] + 0.5f * b[i];
                       })});
  f.kernels.push_back({"triad streaming", run(3, 12, [](float** p, std::size_t n, float&) {
                         detail::stream_triad(p[2], p[0], p[1], 0.5f, n);
                       })});
  return f;
}

// The floor for a pass over a given size: the kernels are measured once, over a ladder of sizes
// (1 MiB, 2 MiB, 4 MiB, ... up to `largest_bytes`), and a size's floor is the best kernel at the ladder's
// step at or below it or at any step above: a pass over more bytes cannot be faster than one over
// fewer, so the best shown over a larger size bounds it too — and taking it smooths what another
// process's load takes from one measurement.
class bandwidth_floors {
 public:
  struct choice {
    std::string kernel;
    double bytes_per_second = 0;
    std::size_t measured_bytes = 0;  // the ladder's step that showed it
  };

  bandwidth_floors(std::size_t threads, int repetitions, std::size_t largest_bytes)
      : threads_(threads), repetitions_(repetitions), largest_(largest_bytes) {}

  choice at(double footprint_bytes) {
    if (measured_.empty()) {
      for (std::size_t bytes = std::size_t{1} << 20; bytes <= largest_; bytes *= 2)
        measured_.emplace(bytes, measure_bandwidth(bytes, threads_, repetitions_));
    }
    // The ladder's step at or below the footprint (the smallest step for smaller ones), and all above.
    auto from = measured_.upper_bound(static_cast<std::size_t>(footprint_bytes));
    if (from != measured_.begin()) --from;
    choice best;
    for (auto it = from; it != measured_.end(); ++it) {
      const bandwidth_floor::kernel& k = it->second.best();
      if (k.bytes_per_second > best.bytes_per_second) best = {k.name, k.bytes_per_second, it->first};
    }
    return best;
  }
  const std::map<std::size_t, bandwidth_floor>& measured() const { return measured_; }
  std::size_t threads() const { return threads_; }

 private:
  std::size_t threads_;
  int repetitions_;
  std::size_t largest_;
  std::map<std::size_t, bandwidth_floor> measured_;
};

// Every floor measured, one line a size, and as JSON fields "<MiB> MiB <kernel>" (bytes per second).
inline void print_floors(const bandwidth_floors& floors, json_rows::row& json) {
  std::printf("\nfloors measured on %zu threads, GB/s (a row's floor: the best at its footprint's step or above):\n",
              floors.threads());
  bool header = true;
  for (const auto& [bytes, floor] : floors.measured()) {
    if (header) {
      std::printf("%10s", "MiB");
      for (const auto& k : floor.kernels) std::printf(" %16s", k.name.c_str());
      std::printf("\n");
      header = false;
    }
    const double mib = static_cast<double>(bytes) / (1 << 20);
    std::printf("%10.1f", mib);
    for (const auto& k : floor.kernels) {
      std::printf(" %16.1f", k.bytes_per_second / 1e9);
      char key[64];
      std::snprintf(key, sizeof key, "%.1f MiB %s", mib, k.name.c_str());
      json.set(key, k.bytes_per_second);
    }
    std::printf("\n");
  }
}

}  // namespace towerpipe_bench
