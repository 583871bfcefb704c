// The library's device element programs, compiled by ctest cuda.no_flush_under_fast_math with
// -use_fast_math to PTX (never run): their float arithmetic must keep subnormals and round each
// operation (core/rounded_math.hpp), whatever flags a user's translation unit has.
#include <towerpipe/cuda/multi_tensor_dispatch.cuh>
#include <towerpipe/cuda/screen_kernel.cuh>
#include <towerpipe/optim/adam.hpp>
#include <towerpipe/optim/adamw.hpp>
#include <towerpipe/optim/sgd.hpp>

namespace towerpipe {
namespace detail {

using policy = multi_tensor_policy;
template __global__ void multi_tensor_kernel<fused_apply_agent<optim::adam, float, 2>, policy>(fused_apply_agent<optim::adam, float, 2>,
                                                                                                const tensor_chunk*, int);
template __global__ void multi_tensor_kernel<fused_apply_agent<optim::adamw, float, 3, bfloat16>, policy>(
    fused_apply_agent<optim::adamw, float, 3, bfloat16>, const tensor_chunk*, int);
template __global__ void multi_tensor_kernel<fused_apply_agent<optim::sgd, float, 2>, policy>(fused_apply_agent<optim::sgd, float, 2>,
                                                                                               const tensor_chunk*, int);
template __global__ void multi_tensor_kernel<tree_round_agent<float>, policy>(tree_round_agent<float>, const tensor_chunk*, int);

}  // namespace detail
}  // namespace towerpipe
