#pragma once
// Vector I/O of the multi-tensor agents: W consecutive elements in registers (CUB vectorised load/store on the device,
// plain loops on the host). Every vector must be aligned: CUB's vectorised store faults on a misaligned pointer.
// Why: docs/design-notes.md#kernels-lanes

#include <cstring>
#include <type_traits>

#include "towerpipe/core/config.hpp"
#include "towerpipe/core/exact_arithmetic.hpp"
#include "towerpipe/core/half_types.hpp"
#include "towerpipe/core/rounded_math.hpp"
#include "towerpipe/kernels/access_hook.hpp"

#if defined(__CUDACC__)
#include <cub/block/block_load.cuh>
#include <cub/block/block_store.cuh>
#include <nv/target>
#endif

TOWERPIPE_EXACT_ARITHMETIC_BEGIN
namespace towerpipe {
namespace detail {

template <class T, unsigned W>
struct lanes {
  T value[W];
};

// W elements one by one: the host's way, and the device's for W = 1.
template <unsigned W, class T>
TOWERPIPE_HOST_DEVICE void copy_elements(T* target, const T* source) {
  for (unsigned l = 0; l < W; ++l) target[l] = source[l];
}

// The host path of the I/O below: the access reported, then made unless the recorder refuses it.
template <unsigned W, class T>
void load_elements_on_host(T* target, const T* source) {
  if (report_access(source, W * sizeof(T), operand_access::read)) {
    copy_elements<W>(target, source);
  } else {
    for (unsigned l = 0; l < W; ++l) target[l] = T();
  }
}
template <unsigned W, class T>
void store_elements_on_host(T* target, const T* source) {
  if (report_access(target, W * sizeof(T), operand_access::write)) copy_elements<W>(target, source);
}

template <unsigned W, class T>
TOWERPIPE_HOST_DEVICE lanes<T, W> load_lanes(const T* p) {
  lanes<T, W> result;
#if defined(__CUDACC__)
  if constexpr (W > 1) {
    // linear_tid 0: the group at p is this thread's alone.
    NV_IF_TARGET(NV_IS_DEVICE, (cub::LoadDirectBlockedVectorized(0, const_cast<T*>(p), result.value);),
                 (load_elements_on_host<W>(result.value, p);))
  } else {
    NV_IF_TARGET(NV_IS_DEVICE, (copy_elements<W>(result.value, p);), (load_elements_on_host<W>(result.value, p);))
  }
#else
  load_elements_on_host<W>(result.value, p);
#endif
  return result;
}

#if defined(__CUDACC__)
// A group of W 16-bit values as one word: CUB's vectorised store has no vector type for bf16 and fp16
// (its generic vector of four is 2-byte aligned, so it writes them one by one). Aligned for the whole
// group like every vector here.
template <unsigned W>
struct half_group_word {
  using type = std::conditional_t<W == 4, uint2, unsigned int>;
};
#endif

template <unsigned W, class T>
TOWERPIPE_HOST_DEVICE void store_lanes(T* p, lanes<T, W> v) {
#if defined(__CUDACC__)
  if constexpr (W > 1 && sizeof(T) == 2) {
    using word = typename half_group_word<W>::type;
    static_assert(sizeof(word) == W * sizeof(T), "towerpipe: a 16-bit group is one word");
    NV_IF_TARGET(NV_IS_DEVICE, (word w; memcpy(&w, v.value, sizeof w); *reinterpret_cast<word*>(p) = w;),
                 (store_elements_on_host<W>(p, v.value);))
  } else if constexpr (W > 1) {
    NV_IF_TARGET(NV_IS_DEVICE, (cub::StoreDirectBlockedVectorized(0, p, v.value);), (store_elements_on_host<W>(p, v.value);))
  } else {
    NV_IF_TARGET(NV_IS_DEVICE, (copy_elements<W>(p, v.value);), (store_elements_on_host<W>(p, v.value);))
  }
#else
  store_elements_on_host<W>(p, v.value);
#endif
}

// Mixed precision: stored (bf16, fp16) values widened exactly to the master type, or master values
// rounded to nearest even into the stored type (core/half_types.hpp); identities where both are T.
template <class To, class From, unsigned W>
TOWERPIPE_HOST_DEVICE lanes<To, W> cast_lanes(const lanes<From, W>& v) {
  lanes<To, W> cast;
  for (unsigned l = 0; l < W; ++l) cast.value[l] = static_cast<To>(v.value[l]);
  return cast;
}

template <class T, unsigned W>
TOWERPIPE_HOST_DEVICE lanes<T, W> scale_lanes(T weight, lanes<T, W> v) {
  for (unsigned l = 0; l < W; ++l) v.value[l] = rounded_mul(weight, v.value[l]);
  return v;
}

template <unsigned W, class T>
TOWERPIPE_HOST_DEVICE lanes<T, W> scaled_lanes(T weight, const T* p) {
  return scale_lanes(weight, load_lanes<W>(p));
}

template <class T, unsigned W>
TOWERPIPE_HOST_DEVICE lanes<T, W> add_lanes(const lanes<T, W>& a, const lanes<T, W>& b) {
  lanes<T, W> sum;
  for (unsigned l = 0; l < W; ++l) sum.value[l] = rounded_add(a.value[l], b.value[l]);
  return sum;
}

}  // namespace detail
}  // namespace towerpipe
TOWERPIPE_EXACT_ARITHMETIC_END
