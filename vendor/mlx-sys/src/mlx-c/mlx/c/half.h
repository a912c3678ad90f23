/* Copyright © 2023-2024 Apple Inc. */

#ifndef MLX_HALF_H
#define MLX_HALF_H

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__ARM_FEATURE_FP16_SCALAR_ARITHMETIC) || defined(__aarch64__)
#define HAS_FLOAT16
#include <arm_fp16.h>
typedef __fp16 float16_t;
#else
/* non-ARM (e.g. x86_64): storage-only 16-bit types. The C API only passes
 * them by pointer, so the C++ side may use any 2-byte type; clang (bindgen)
 * sees __fp16 so mlx-rs gets the same Rust types as on ARM. */
#define HAS_FLOAT16
#if defined(__clang__)
typedef __fp16 float16_t;
#else
typedef unsigned short float16_t;
#endif
#endif

#if defined(__ARM_FEATURE_BF16) || defined(__aarch64__)
#define HAS_BFLOAT16
#include <arm_bf16.h>
typedef __bf16 bfloat16_t;
#else
#define HAS_BFLOAT16
typedef unsigned short bfloat16_t;
#endif

#ifdef __cplusplus
}
#endif

#endif
