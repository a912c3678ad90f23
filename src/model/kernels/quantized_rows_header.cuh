// Header of the quantized-rows kernel (quantized_rows.cu): MLX's default header has
// cooperative groups; this adds `cg::reduce` (MLX's own warp reduction), the helpers that
// keep two accumulators of the 2-byte element type in one register, and the paired 4-bit
// dequantization. `fma.rn.bf16x2` / `fma.rn.f16x2` round each half once, exactly as the scalar
// `fma.rn.bf16` / `fma.rn.f16` of MLX's kernel, so a pair is two of MLX's accumulators in half
// the instructions. Overloads on the element type (a tag argument), because the kernel's body
// is not a template.
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

// 4-bit dequantization in pairs: word `w` holds weights q0..q7 (qi in bits 4i..4i+3); pair j
// (weights 2j, 2j + 1) becomes T2(fma(q, scale, bias)) with one rounding per half. For the
// 2-byte types q is made exactly in the type, without integer-to-float conversions: q in the
// low mantissa bits of MAGIC (bf16 0x4300 = 128, f16 0x6400 = 1024) is MAGIC + q, then
// `- MAGIC` (exact); the fma is the paired `fma.rn` (product and sum exact, one rounding).
// On the H200 this gives MLX's bits in every case of quantized_rows.py (f32 keeps fmaf).
__device__ __forceinline__ unsigned memexec_pair_bits(unsigned t, unsigned u, int j, unsigned magic) {
  return (__byte_perm(t, u, j | ((4 + j) << 8)) & 0x00ff00ffu) | magic;
}
// The 2-byte types' pairs: `magic` holds MAGIC's bits in both halves, `m2` its value.
template <typename T2, int NW>
__device__ __forceinline__ void memexec_dequant_pairs(const unsigned (&words)[NW], T2 s2, T2 b2,
                                                      T2 m2, unsigned magic, T2 (&wd)[NW * 4]) {
#pragma unroll
  for (int i = 0; i < NW; ++i) {
    const unsigned t = words[i] & 0x0f0f0f0fu;
    const unsigned u = (words[i] >> 4) & 0x0f0f0f0fu;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const unsigned v = memexec_pair_bits(t, u, j, magic);
      const T2 q = __hsub2(*reinterpret_cast<const T2*>(&v), m2);
      wd[i * 4 + j] = __hfma2(q, s2, b2);
    }
  }
}
template <int NW>
__device__ __forceinline__ void memexec_dequant(const unsigned (&words)[NW], __nv_bfloat16 s,
                                                __nv_bfloat16 b, __nv_bfloat162 (&wd)[NW * 4]) {
  memexec_dequant_pairs(words, __bfloat162bfloat162(s), __bfloat162bfloat162(b),
                        __float2bfloat162_rn(128.0f), 0x43004300u, wd);
}
template <int NW>
__device__ __forceinline__ void memexec_dequant(const unsigned (&words)[NW], __half s, __half b,
                                                __half2 (&wd)[NW * 4]) {
  memexec_dequant_pairs(words, __half2half2(s), __half2half2(b), __float2half2_rn(1024.0f),
                        0x64006400u, wd);
}
template <int NW>
__device__ __forceinline__ void memexec_dequant(const unsigned (&words)[NW], float s, float b,
                                                float2 (&wd)[NW * 4]) {
#pragma unroll
  for (int i = 0; i < NW; ++i) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const float q0 = static_cast<float>((words[i] >> (8 * j)) & 0xfu);
      const float q1 = static_cast<float>((words[i] >> (8 * j + 4)) & 0xfu);
      wd[i * 4 + j] = make_float2(fmaf(q0, s, b), fmaf(q1, s, b));
    }
  }
}
