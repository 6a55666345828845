// float16 for the Gloo baseline's 16-bit variant: conversion from and to
// float32 and addition in IEEE binary16, round to nearest even, as
// gloo::float16's operators define it (a sum is rounded to float16, as
// PyTorch's Gloo float16 all-reduce adds). F16C instructions where the CPU has
// them, GCC's _Float16 (libgcc's conversions) elsewhere and for the tail; both
// give the same bits. Not Gloo's own scalar conversions (gloo/types.h): they
// read a float through an unsigned pointer, which GCC at -O2 miscompiles once
// they are inlined (strict aliasing; the unit test's reference did).
#pragma once

#include <gloo/types.h>

#include <cstddef>

namespace xagg::backends::float16 {

// out[i] = in[i] / divisor, rounded to float16 (DDP's fp16_compress_hook divides by the world size first).
void from_float(const float* in, gloo::float16* out, size_t count, float divisor = 1.0f);
// Exact: every float16 is a float32.
void to_float(const gloo::float16* in, float* out, size_t count);
// out[i] = a[i] + b[i], rounded to float16; out may be a or b.
void add(gloo::float16* out, const gloo::float16* a, const gloo::float16* b, size_t count);

}  // namespace xagg::backends::float16
