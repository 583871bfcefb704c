// The training program's 16-bit GPU towers (train --precision bf16 | fp16 with GPU towers): their
// trainings through every backend, in a translation unit of their own so that it compiles in parallel
// with train_gpu.cu.
#include "train_gpu.cuh"

namespace towerpipe_examples::training {
TOWERPIPE_EXAMPLES_FOR_OPTIMIZERS(, train_on_gpus, bf16_layout)
TOWERPIPE_EXAMPLES_FOR_OPTIMIZERS(, train_on_gpus, fp16_layout)
}  // namespace towerpipe_examples::training
