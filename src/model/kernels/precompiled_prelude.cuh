// What memexec's kernels take from MLX's default custom-kernel header (mlx/backend/cuda/
// custom_kernel.cpp includes mlx/backend/cuda/device/utils.cuh, which MLX's wheel keeps inside
// libmlx.so, not as a file): cooperative groups, bf16 / fp16, cuda::std traits and the
// fixed-width integers. memexec compiles each precompiled module after this prelude
// (src/nvrtc_ffi.rs); scripts/gpu/precompiled.py and nvrtc_check.py read this same file.
#include <cuda/std/cstdint>
#include <cuda/std/type_traits>
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
using int64_t = long long; using uint64_t = unsigned long long; using int32_t = int;
using uint32_t = unsigned int; using uint8_t = unsigned char; using uint16_t = unsigned short;
using int8_t = signed char; using int16_t = short; using uintptr_t = unsigned long long;
