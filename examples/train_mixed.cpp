// train --precision bf16 | fp16: the trainings with 16-bit towers (host towers; 16-bit GPU towers call
// train_on_gpus, built in the generated train_gpu_units/*.cu), in a translation unit of their own so that they compile
// in parallel with train.cpp's fp32 towers (train_loop.hpp has the loop, mixed_precision.hpp the
// towers' fp32 scratch).
#include "train_loop.hpp"

namespace towerpipe_examples::training {
TOWERPIPE_EXAMPLES_FOR_OPTIMIZERS(, train_with_backend, bf16_layout)
TOWERPIPE_EXAMPLES_FOR_OPTIMIZERS(, train_with_backend, fp16_layout)
}  // namespace towerpipe_examples::training
