// Header of the quantized-rows kernel (quantized_rows.cu): MLX's default header has
// cooperative groups; this adds `cg::reduce` (MLX's own warp reduction) and the helpers that
// keep two accumulators of the 2-byte element type in one register. `fma.rn.bf16x2` /
// `fma.rn.f16x2` round each half once, exactly as the scalar `fma.rn.bf16` / `fma.rn.f16` of
// MLX's kernel, so a pair is two of MLX's accumulators in half the instructions. Overloads on
// the element type (a tag argument), because the kernel's body is not a template.
#include <cooperative_groups/reduce.h>

__device__ __forceinline__ __nv_bfloat162 memexec_cvt2(__nv_bfloat16, float a, float b) {
  return __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ __half2 memexec_cvt2(__half, float a, float b) {
  return __floats2half2_rn(a, b);
}
__device__ __forceinline__ float2 memexec_cvt2(float, float a, float b) {
  return make_float2(a, b);
}
__device__ __forceinline__ __nv_bfloat162 memexec_fma2(__nv_bfloat162 a, __nv_bfloat162 b,
                                                       __nv_bfloat162 c) {
  return __hfma2(a, b, c);
}
__device__ __forceinline__ __half2 memexec_fma2(__half2 a, __half2 b, __half2 c) {
  return __hfma2(a, b, c);
}
__device__ __forceinline__ float2 memexec_fma2(float2 a, float2 b, float2 c) {
  return make_float2(fmaf(a.x, b.x, c.x), fmaf(a.y, b.y, c.y));
}
__device__ __forceinline__ float2 memexec_float2(__nv_bfloat162 p) {
  return __bfloat1622float2(p);
}
__device__ __forceinline__ float2 memexec_float2(__half2 p) { return __half22float2(p); }
__device__ __forceinline__ float2 memexec_float2(float2 p) { return p; }
