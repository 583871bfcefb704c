// Put first on the include path of CUDA targets built without NCCL (CMakeLists.txt:
// towerpipe_refuse_nccl), so that a part which needs NCCL but was not left out fails to compile even
// where the CUDA toolkit ships nccl.h.
#error "<nccl.h> included in a build configured without NCCL (TOWERPIPE_ENABLE_NCCL=OFF or NCCL not found): leave this part out of such builds"
