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
// typedefs of cuda::std's types, not `using X = long long`: a typedef may name again the type a
// name already has, so this holds whether or not the NVRTC headers declare ::int64_t & co.
typedef cuda::std::int8_t int8_t;
typedef cuda::std::int16_t int16_t;
typedef cuda::std::int32_t int32_t;
typedef cuda::std::int64_t int64_t;
typedef cuda::std::uint8_t uint8_t;
typedef cuda::std::uint16_t uint16_t;
typedef cuda::std::uint32_t uint32_t;
typedef cuda::std::uint64_t uint64_t;
typedef cuda::std::uintptr_t uintptr_t;
