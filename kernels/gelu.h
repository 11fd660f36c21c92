/* The scalar GELUs every path is measured against (kernels.h's epilogues: the tanh approximation, the exact
 * GELU and the quick one), shared by the scalar GEMM epilogue and the scalar training kernels so that both
 * compute the same functions. */
#pragma once

#include <math.h>

#define GELU_SQRT_2_OVER_PI 0.797884561f
#define GELU_CUBIC          0.044715f

/* 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))), in F32 as kernels.h pins it. */
static inline float gelu_tanh(float x) {
    return 0.5f * x * (1.0f + tanhf(GELU_SQRT_2_OVER_PI * (x + GELU_CUBIC * x * x * x)));
}

/* 0.5x(1 + erf(x / sqrt 2)), in F32 with libm's erff, as PyTorch's nn.GELU() computes it. */
static inline float gelu_erf(float x) {
    return 0.5f * x * (1.0f + erff(x * 0.707106781f));
}

/* x sigmoid(1.702x) = x / (1 + exp(-1.702x)), in F32 with libm's expf (an infinite exp gives -0). */
static inline float gelu_quick(float x) {
    return x / (1.0f + expf(-1.702f * x));
}

/* d gelu_tanh / dx = 0.5(1 + t) + 0.5x(1 - t^2) sqrt(2/pi)(1 + 3 * 0.044715x^2), t = tanh(u), computed in
 * double from the F32 constants above: in F32, 1 + t and 1 - t^2 lose up to 4 digits to cancellation
 * where |u| is large, and the reference must be the most accurate path. */
static inline float gelu_tanh_derivative(float x) {
    double const c = (double)GELU_SQRT_2_OVER_PI, a = (double)GELU_CUBIC, v = (double)x;
    double u = c * (v + a * v * v * v), t = tanh(u), cosine = cosh(u); /* 1 - t^2 = 1 / cosh(u)^2 */
    return (float)(0.5 * (1.0 + t) + 0.5 * v / (cosine * cosine) * c * (1.0 + 3.0 * a * v * v));
}
