/* The CUDA libraries opened on first use (kernels/cuda/cuda_library.h), on any machine with the toolkit's
 * libraries, a GPU or not. In this order, as a load is once per process:
 *
 *   - the constructors of kernels/cuda's objects recorded their fatbins and kernels, and nothing else;
 *   - before a load, the forwarded entry points refuse (cudaErrorInitializationError, cuBLASLt's
 *     NOT_INITIALIZED, a sentence for the error strings) rather than call through nothing;
 *   - a missing library fails the load with a message naming its role, the driver first, closing what
 *     was opened, and a later load tries again;
 *   - a load with a stand-in for the driver (any library that opens) opens the build's runtime and
 *     cuBLASLt, resolves every entry point in them and replays the recorded kernels into the runtime;
 *     from then on the calls reach the runtime: its own error strings, and a kernel launch through
 *     nvcc's sequence answers the runtime's error where no driver runs it (or runs it on a GPU);
 *   - NCCL (where the build found it) refuses before its own load, which waits for the runtime's, names
 *     a missing library, and once loaded answers its version. */
#include <stdio.h>
#include <string.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "cuda/cuda_kernels.h"
#include "cuda/cuda_library.h"
#include "fixtures.h"
#include "uform_config.h"
#if UFORM_WITH_NCCL
#include <nccl.h>
#endif

#define SKIP 77

/* Any library that opens, standing for the driver. */
static char const stand_in[] = "libm.so.6";

static void registrations_recorded(void **state) {
    (void)state;
    cuda_library_registered_t registered = cuda_library_registrations();
    fprintf(stderr, "  recorded: %zu fatbins, %zu kernels, %zu variables\n", registered.fatbins,
            registered.functions, registered.variables);
    assert_false(registered.overflow);
    assert_true(registered.fatbins >= 1);
    assert_true(registered.functions >= registered.fatbins); /* every object holds a kernel */
}

static void refused_before_a_load(void **state) {
    (void)state;
    int count = -1;
    assert_int_equal(cudaGetDeviceCount(&count), cudaErrorInitializationError);
    assert_int_equal(count, -1);
    assert_non_null(strstr(cudaGetErrorString(cudaErrorNoDevice), "not loaded"));
    cublasLtHandle_t handle = NULL;
    assert_int_equal(cublasLtCreate(&handle), CUBLAS_STATUS_NOT_INITIALIZED);
    assert_int_equal(cuda_f32_to_bf16(NULL, NULL, 1, NULL), cudaErrorInitializationError);
    char const *message = NULL;
    assert_false(cuda_library_load_nccl(&message));
    assert_non_null(message);
    assert_false(cuda_library_nccl_loaded());
#if UFORM_WITH_NCCL
    assert_non_null(strstr(message, "after the CUDA runtime"));
    int version = -1;
    assert_int_equal(ncclGetVersion(&version), ncclInvalidUsage);
    assert_int_equal(version, -1);
    assert_non_null(strstr(ncclGetErrorString(ncclSuccess), "not loaded"));
#else
    assert_non_null(strstr(message, "without NCCL"));
#endif
}

/* A load of `names` fails with the message of `role`, and leaves nothing loaded. */
static void assert_load_fails(cuda_library_names_t names, char const *role) {
    char const *message = NULL;
    assert_false(cuda_library_load_from(&names, &message));
    assert_non_null(message);
    if (!strstr(message, role)) fail_msg("the message '%s' does not name %s", message, role);
    assert_false(cuda_library_loaded());
}

static void missing_libraries_named(void **state) {
    (void)state;
    cuda_library_names_t names = cuda_library_sonames;
    names.driver = "libuform-no-such-driver.so.1";
    assert_load_fails(names, "libcuda.so.1, the NVIDIA driver");
    names.driver = stand_in;
    names.runtime = "libuform-no-such-runtime.so.1";
    assert_load_fails(names, "the CUDA runtime");
    names.runtime = cuda_library_sonames.runtime;
    names.blas = "libuform-no-such-cublasLt.so.1";
    assert_load_fails(names, "cuBLASLt");
    names.blas = stand_in; /* opens, but holds none of cuBLASLt's functions */
    assert_load_fails(names, "lacks an entry point");
    int count = -1;
    assert_int_equal(cudaGetDeviceCount(&count), cudaErrorInitializationError);
}

static void stand_in_driver_loads_and_replays(void **state) {
    (void)state;
    cuda_library_names_t names = cuda_library_sonames;
    names.driver = stand_in;
    char const *message = NULL;
    if (!cuda_library_load_from(&names, &message)) fail_msg("the load failed: %s", message);
    assert_true(cuda_library_loaded());
    assert_true(cuda_library_load(&message)); /* once per process */
    /* The runtime's own strings now, not the refusal's. */
    char const *text = cudaGetErrorString(cudaErrorNoDevice);
    fprintf(stderr, "  cudaGetErrorString(cudaErrorNoDevice): %s\n", text);
    assert_null(strstr(text, "not loaded"));
    assert_string_equal(cudaGetErrorName(cudaErrorNoDevice), "cudaErrorNoDevice");
    int count = 0;
    cudaError_t error = cudaGetDeviceCount(&count);
    fprintf(stderr, "  cudaGetDeviceCount: %s, %d\n", cudaGetErrorName(error), count);
    /* A launch through nvcc's sequence and the replayed registration: the runtime's answer where no
     * driver runs it, success where one does (n = 0 launches nothing, so a kernel over nothing). */
    uint16_t *out = NULL;
    float *in = NULL;
    if (error == cudaSuccess && count > 0) {
        assert_int_equal(cudaMalloc((void **)&out, 64), cudaSuccess);
        assert_int_equal(cudaMalloc((void **)&in, 64), cudaSuccess);
    }
    cudaError_t launched = cuda_f32_to_bf16(out, in, 16, NULL);
    fprintf(stderr, "  cuda_f32_to_bf16 launch: %s\n", cudaGetErrorName(launched));
    assert_true(launched != cudaErrorInitializationError);
    if (error == cudaSuccess && count > 0) {
        assert_int_equal(launched, cudaSuccess);
        assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
        cudaFree(out);
        cudaFree(in);
    }
    cublasLtHandle_t handle = NULL;
    cublasStatus_t created = cublasLtCreate(&handle);
    assert_true(created != CUBLAS_STATUS_NOT_INITIALIZED || error != cudaSuccess);
    if (created == CUBLAS_STATUS_SUCCESS) cublasLtDestroy(handle);
}

/* After the runtime: NCCL by another name is named missing and nothing stays loaded; by the build's, it
 * loads and answers its version (no device needed). */
static void nccl_loads_after_the_runtime(void **state) {
    (void)state;
#if UFORM_WITH_NCCL
    char const *message = NULL;
    assert_true(cuda_library_loaded());
    assert_false(cuda_library_load_nccl_from("libuform-no-such-nccl.so.2", &message));
    fprintf(stderr, "  a missing NCCL: %s\n", message);
    assert_non_null(strstr(message, cuda_library_nccl_soname));
    assert_false(cuda_library_nccl_loaded());
    assert_false(cuda_library_load_nccl_from("libm.so.6", &message)); /* opens, holds no NCCL */
    assert_non_null(strstr(message, "lacks an entry point"));
    if (!cuda_library_load_nccl(&message)) fail_msg("NCCL did not load: %s", message);
    assert_true(cuda_library_nccl_loaded());
    int version = 0;
    assert_int_equal(ncclGetVersion(&version), ncclSuccess);
    fprintf(stderr, "  %s: version %d\n", cuda_library_nccl_soname, version);
    assert_true(version >= 20000);
    assert_null(strstr(ncclGetErrorString(ncclSuccess), "not loaded"));
#else
    skip();
#endif
}

int main(void) {
    if (cuda_library_loaded()) {
        printf("SKIP: the CUDA libraries are loaded already\n");
        return SKIP;
    }
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(registrations_recorded),       cmocka_unit_test(refused_before_a_load),
        cmocka_unit_test(missing_libraries_named),      cmocka_unit_test(stand_in_driver_loads_and_replays),
        cmocka_unit_test(nccl_loads_after_the_runtime),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
