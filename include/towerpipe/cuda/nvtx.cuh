#pragma once
// NVTX ranges around the pipeline's stages on GPU towers, so that Nsight Systems shows them beside
// the kernels (NVTX 3 is header-only and costs next to nothing when no tool is attached).

#include <nvtx3/nvToolsExt.h>

namespace towerpipe {
namespace detail {

class nvtx_range {
 public:
  explicit nvtx_range(const char* name) { nvtxRangePushA(name); }
  ~nvtx_range() { nvtxRangePop(); }
  nvtx_range(const nvtx_range&) = delete;
  nvtx_range& operator=(const nvtx_range&) = delete;
};

}  // namespace detail
}  // namespace towerpipe
