/* The CUDA libraries, loaded on first use (kernels/cuda/cuda_library.c).
 *
 * The engine does not link the CUDA runtime or cuBLASLt: a process that never makes a VRAM executor maps
 * neither, nor the driver. The first VRAM executor calls cuda_library_load, which opens the driver
 * (libcuda.so.1), then the runtime and cuBLASLt by the sonames the build found (uform_config.h:
 * UFORM_CUDART_SONAME, UFORM_CUBLASLT_SONAME), and from then on every runtime and cuBLASLt function the
 * engine calls, and the kernel launches nvcc compiles, go through the functions they export. Before a
 * successful load, those functions answer cudaErrorInitializationError (CUBLAS_STATUS_NOT_INITIALIZED
 * for cuBLASLt; cudaGetErrorName and cudaGetErrorString a sentence saying CUDA is not loaded). */
#pragma once

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The libraries a load opens, in this order, each with RTLD_NOW | RTLD_LOCAL. */
typedef struct cuda_library_names {
    char const *driver;  /* libcuda.so.1 */
    char const *runtime; /* UFORM_CUDART_SONAME */
    char const *blas;    /* UFORM_CUBLASLT_SONAME */
} cuda_library_names_t;

/* What the build found. */
extern cuda_library_names_t const cuda_library_sonames;

/* Opens the libraries of cuda_library_sonames, once per process: true when they are open (now or by an
 * earlier call). Otherwise false with a static message naming the library that is missing (the driver
 * first: a machine without an NVIDIA GPU has none) or lacks an entry point, having closed what it opened
 * so that a later call tries again. Thread-safe; blocks while another thread loads. */
bool cuda_library_load(char const **message);

/* cuda_library_load of other names (tests: a library that is missing). The message names the role and
 * the build's soname of the library that failed, whatever `names` holds. */
bool cuda_library_load_from(cuda_library_names_t const *names, char const **message);

/* Whether a load succeeded in this process. */
bool cuda_library_loaded(void);

/* What the constructors of kernels/cuda's objects registered, recorded until a load replays it into the
 * runtime: fatbins, kernels and device variables. */
typedef struct cuda_library_registered {
    size_t fatbins, functions, variables;
    bool overflow; /* more than the record holds: a load answers false */
} cuda_library_registered_t;

cuda_library_registered_t cuda_library_registrations(void);

/* NCCL, opened by the first mesh over VRAM executors that asks for it, once the runtime is loaded, by the
 * soname the build found (cuda_library_nccl_soname: UFORM_NCCL_SONAME, NULL in builds without NCCL), with
 * RTLD_NOW | RTLD_LOCAL. True when it is open (now or earlier); otherwise false with a static message:
 * the runtime not loaded yet, a build without NCCL, the library missing (named) or lacking an entry point,
 * having closed what it opened. Before a load NCCL's functions answer ncclInvalidUsage
 * (ncclGetErrorString a sentence saying NCCL is not loaded). Thread-safe. */
extern char const *const cuda_library_nccl_soname;
bool cuda_library_load_nccl(char const **message);
/* cuda_library_load_nccl of another name (tests: a library that is missing). */
bool cuda_library_load_nccl_from(char const *soname, char const **message);
bool cuda_library_nccl_loaded(void);

#ifdef __cplusplus
}
#endif
