#pragma once
// reduce::automatic with GPU towers (reduce/automatic.hpp has the policy and its reducer): the towers'
// devices and the links between them as the runtime reports them, the candidates the layout allows,
// and the copy of the towers' gradients that pipeline_options::time_backends restores before each
// trial. The choice itself is choose_backend's (reduce/backend_choice.hpp), tested on the host.

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <vector>

#include "towerpipe/core/half_types.hpp"
#include "towerpipe/cuda/check.cuh"
#include "towerpipe/cuda/device.cuh"
#include "towerpipe/cuda/memory.cuh"
#include "towerpipe/exec/cuda.cuh"
#include "towerpipe/reduce/automatic.hpp"
#include "towerpipe/reduce/device0.cuh"
#include "towerpipe/reduce/host_for_cuda.cuh"
#include "towerpipe/reduce/p2p_tree.cuh"
#include "towerpipe/reduce/sharded/gpu_towers.cuh"

namespace towerpipe {
namespace detail {

template <class Layout>
struct automatic_space<cuda_towers<Layout>> {
  // A pair of towers' devices is linked where the reductions may reach one from the other in place
  // (peer access enabled, and pipeline_options::direct_device_access); NVLink where the runtime reports
  // native peer atomics, which PCIe peers lack.
  static tower_topology describe(cuda_towers<Layout>& towers) {
    tower_topology t;
    for (std::size_t i = 0; i < towers.towers(); ++i) t.tower_devices.push_back(towers.device(i));
    for (std::size_t a = 0; a < towers.towers(); ++a) {
      for (std::size_t b = 0; b < towers.towers(); ++b) {
        const int from = towers.device(a), to = towers.device(b);
        if (from == to || !towers.access().reaches(a, b) || t.links.count({from, to}) != 0) continue;
        int atomics = 0;
        TOWERPIPE_CUDA_CHECK(cudaDeviceGetP2PAttribute(&atomics, cudaDevP2PAttrNativeAtomicSupported, from, to));
        t.links[{from, to}] = atomics ? peer_link::nvlink : peer_link::pcie;
      }
    }
    return t;
  }

  // Each tower's gradients copied on its own device, on its stream (after its backward pass), and back.
  class gradient_copy {
   public:
    gradient_copy(const variable_set& variables, cuda_towers<Layout>& towers) : variables_(variables) {
      for (std::size_t t = 0; t < towers.towers(); ++t)
        saved_.push_back(std::make_unique<typename cuda_towers<Layout>::device_buffer>(variables, cuda_device_memory{towers.device(t)}));
    }
    void save(cuda_towers<Layout>& towers) { copy(towers, true); }
    void restore(cuda_towers<Layout>& towers) { copy(towers, false); }

   private:
    void copy(cuda_towers<Layout>& towers, bool saving) {
      towers.synchronize_all();  // the last trial's reduction may still read or write the gradients
      for (std::size_t t = 0; t < towers.towers(); ++t) {
        device_guard on(towers.device(t));
        for (std::size_t v = 0; v < variables_.count(); ++v) {
          auto* own = towers.gradients(t).data(v);
          auto* kept = saved_[t]->data(v);
          TOWERPIPE_CUDA_CHECK(cudaMemcpyAsync(saving ? kept : own, saving ? own : kept, variables_[v].size * sizeof(*own),
                                               cudaMemcpyDeviceToDevice, towers.stream(t).get()));
        }
      }
      towers.synchronize_all();
    }

    const variable_set& variables_;
    std::vector<std::unique_ptr<typename cuda_towers<Layout>::device_buffer>> saved_;
  };
};

// Every backend for GPU towers is a candidate, with any precision (16-bit towers included).
template <class Optim, class Layout>
struct automatic_cuda_reducer {
  using type = automatic_reducer<
      cuda_towers<Layout>, Optim, Layout,
      automatic_candidate<backend_kind::device0, typename reducer_for<exec::cuda, reduce::device0, Optim, Layout>::type>,
      automatic_candidate<backend_kind::p2p_tree, typename reducer_for<exec::cuda, reduce::p2p_tree, Optim, Layout>::type>,
      automatic_candidate<backend_kind::sharded, typename reducer_for<exec::cuda, reduce::sharded, Optim, Layout>::type>,
      automatic_candidate<backend_kind::host, typename reducer_for<exec::cuda, reduce::host, Optim, Layout>::type>>;
};

}  // namespace detail

template <class Optim, class Layout>
struct reducer_for<exec::cuda, reduce::automatic, Optim, Layout> {
  using type = typename detail::automatic_cuda_reducer<Optim, Layout>::type;
};

}  // namespace towerpipe
