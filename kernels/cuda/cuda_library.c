/* The CUDA libraries, loaded on first use (cuda_library.h).
 *
 *   process start  the constructors nvcc writes into kernels/cuda's objects register each object's fatbin,
 *                  its kernels and its device variables (__cudaRegisterFatBinary, __cudaRegisterFunction,
 *                  __cudaRegisterVar, __cudaRegisterFatBinaryEnd): recorded here, in order, in static
 *                  arrays (no allocation before main);
 *   first load     dlopen of the driver, the runtime and cuBLASLt; dlsym of every entry point listed
 *                  below into `api`; the record replayed into the runtime, each fatbin then its kernels and
 *                  variables then its end, as the runtime would have seen them had it been linked;
 *   after          each function listed below calls the runtime's (or cuBLASLt's) through `api`. A launch
 *                  `kernel<<<grid, block, shared, stream>>>(...)` compiles to __cudaPushCallConfiguration,
 *                  then the kernel's host stub: __cudaPopCallConfiguration, __cudaGetKernel (once per
 *                  launch site, for the handle of the stub's registered kernel) and __cudaLaunchKernel
 *                  (CUDA 13; cudaLaunchKernel before), all forwarded as they are;
 *   exit           __cudaUnregisterFatBinary, which nvcc's atexit handlers call, is forwarded for the
 *                  fatbins replayed. The order is that of a program linked with the static runtime (nvcc's
 *                  default), whose runtime also starts after the constructors ran and is torn down first.
 *
 * Every function here is hidden: libuform.so exports none of them, libuform.a has them local
 * (scripts/localize_static.sh), and no other CUDA runtime in the process is interposed. The runtime's and
 * cuBLASLt's functions are defined with the toolkit's headers in view, which check their signatures; the
 * __cuda* ones, which only nvcc's C++ headers declare, are declared here as crt/host_runtime.h and
 * crt/device_functions.h declare them. An entry point nvcc's objects call that is not defined here fails
 * the link (-Wl,--no-undefined), not a run.
 *
 * NCCL is opened the same way, later and apart: by the first mesh over VRAM executors that asks for it
 * (cuda_library_load_nccl, after the runtime), by the soname the build found, its entry points listed in
 * NCCL_CALLS and forwarded as the runtime's are. A process that meshes no VRAM executor maps no NCCL. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "uform_config.h"
#if UFORM_WITH_NCCL
#include <nccl.h>
#endif
#include "cuda_library.h"

#if defined(CUDA_API_PER_THREAD_DEFAULT_STREAM)
#error                                                                                                       \
    "the engine calls the legacy-default-stream entry points: CUDA_API_PER_THREAD_DEFAULT_STREAM is not supported"
#endif

#define HIDDEN            __attribute__((visibility("hidden")))
#define CUDA_FATBINS      16
#define CUDA_REGISTRATION 1024 /* kernels and variables of every fatbin */
#define DRIVER_SONAME     "libcuda.so.1"

/* The name a symbol is exported under, after the header's renaming macros (cudaGetDeviceProperties is
 * cudaGetDeviceProperties_v2 in some toolkits). */
#define SYMBOL_NAME(name) #name
#define SYMBOL(name)      SYMBOL_NAME(name)

/* ---- nvcc's registration and launch sequence ---------------------------------------------------- */

HIDDEN void **CUDARTAPI __cudaRegisterFatBinary(void *fatbin);
HIDDEN void CUDARTAPI __cudaRegisterFatBinaryEnd(void **handle);
HIDDEN void CUDARTAPI __cudaUnregisterFatBinary(void **handle);
HIDDEN void CUDARTAPI __cudaRegisterFunction(void **handle, char const *host, char *device, char const *name,
                                             int thread_limit, uint3 *tid, uint3 *bid, dim3 *block,
                                             dim3 *grid, int *warp);
HIDDEN void CUDARTAPI __cudaRegisterVar(void **handle, char *host, char *device, char const *name, int ext,
                                        size_t size, int constant, int global);
HIDDEN unsigned CUDARTAPI __cudaPushCallConfiguration(dim3 grid, dim3 block, size_t shared,
                                                      struct CUstream_st *stream);
HIDDEN cudaError_t CUDARTAPI __cudaPopCallConfiguration(dim3 *grid, dim3 *block, size_t *shared,
                                                        void *stream);
#if CUDART_VERSION >= 13000
HIDDEN cudaError_t CUDARTAPI __cudaGetKernel(cudaKernel_t *kernel, void const *function);
HIDDEN cudaError_t CUDARTAPI __cudaLaunchKernel(cudaKernel_t kernel, dim3 grid, dim3 block, void **args,
                                                size_t shared, cudaStream_t stream);
#endif

/* ---- The entry points forwarded ----------------------------------------------------------------- */

/* X(library, type, name, parameters, arguments, answer before a load) for every function forwarded as
 * it is. */
#define CUDA_RUNTIME_CALLS(X)                                                                                \
    X(runtime, cudaError_t, cudaGetDeviceCount, (int *count), (count), cudaErrorInitializationError)         \
    X(runtime, cudaError_t, cudaGetDevice, (int *device), (device), cudaErrorInitializationError)            \
    X(runtime, cudaError_t, cudaSetDevice, (int device), (device), cudaErrorInitializationError)             \
    X(runtime, cudaError_t, cudaGetDeviceProperties, (struct cudaDeviceProp * properties, int device),       \
      (properties, device), cudaErrorInitializationError)                                                    \
    X(runtime, cudaError_t, cudaDeviceSynchronize, (void), (), cudaErrorInitializationError)                 \
    X(runtime, cudaError_t, cudaDeviceCanAccessPeer, (int *can, int device, int peer), (can, device, peer),  \
      cudaErrorInitializationError)                                                                          \
    X(runtime, cudaError_t, cudaDeviceEnablePeerAccess, (int peer, unsigned int flags), (peer, flags),       \
      cudaErrorInitializationError)                                                                          \
    X(runtime, cudaError_t, cudaGetLastError, (void), (), cudaErrorInitializationError)                      \
    X(runtime, char const *, cudaGetErrorName, (cudaError_t error), (error), not_loaded_name)                \
    X(runtime, char const *, cudaGetErrorString, (cudaError_t error), (error), not_loaded_text)              \
    X(runtime, cudaError_t, cudaStreamCreate, (cudaStream_t * stream), (stream),                             \
      cudaErrorInitializationError)                                                                          \
    X(runtime, cudaError_t, cudaStreamCreateWithFlags, (cudaStream_t * stream, unsigned int flags),          \
      (stream, flags), cudaErrorInitializationError)                                                         \
    X(runtime, cudaError_t, cudaStreamDestroy, (cudaStream_t stream), (stream),                              \
      cudaErrorInitializationError)                                                                          \
    X(runtime, cudaError_t, cudaStreamSynchronize, (cudaStream_t stream), (stream),                          \
      cudaErrorInitializationError)                                                                          \
    X(runtime, cudaError_t, cudaStreamWaitEvent,                                                             \
      (cudaStream_t stream, cudaEvent_t event, unsigned int flags), (stream, event, flags),                  \
      cudaErrorInitializationError)                                                                          \
    X(runtime, cudaError_t, cudaEventCreateWithFlags, (cudaEvent_t * event, unsigned int flags),             \
      (event, flags), cudaErrorInitializationError)                                                          \
    X(runtime, cudaError_t, cudaEventDestroy, (cudaEvent_t event), (event), cudaErrorInitializationError)    \
    X(runtime, cudaError_t, cudaEventRecord, (cudaEvent_t event, cudaStream_t stream), (event, stream),      \
      cudaErrorInitializationError)                                                                          \
    X(runtime, cudaError_t, cudaEventQuery, (cudaEvent_t event), (event), cudaErrorInitializationError)      \
    X(runtime, cudaError_t, cudaMalloc, (void **pointer, size_t bytes), (pointer, bytes),                    \
      cudaErrorInitializationError)                                                                          \
    X(runtime, cudaError_t, cudaFree, (void *pointer), (pointer), cudaErrorInitializationError)              \
    X(runtime, cudaError_t, cudaHostAlloc, (void **pointer, size_t bytes, unsigned int flags),               \
      (pointer, bytes, flags), cudaErrorInitializationError)                                                 \
    X(runtime, cudaError_t, cudaFreeHost, (void *pointer), (pointer), cudaErrorInitializationError)          \
    X(runtime, cudaError_t, cudaMemcpy,                                                                      \
      (void *to, void const *from, size_t bytes, enum cudaMemcpyKind kind), (to, from, bytes, kind),         \
      cudaErrorInitializationError)                                                                          \
    X(runtime, cudaError_t, cudaMemcpy2D,                                                                    \
      (void *to, size_t to_pitch, void const *from, size_t from_pitch, size_t width, size_t height,          \
       enum cudaMemcpyKind kind),                                                                            \
      (to, to_pitch, from, from_pitch, width, height, kind), cudaErrorInitializationError)                   \
    X(runtime, cudaError_t, cudaMemcpy2DAsync,                                                               \
      (void *to, size_t to_pitch, void const *from, size_t from_pitch, size_t width, size_t height,          \
       enum cudaMemcpyKind kind, cudaStream_t stream),                                                       \
      (to, to_pitch, from, from_pitch, width, height, kind, stream), cudaErrorInitializationError)           \
    X(runtime, cudaError_t, cudaMemcpyAsync,                                                                 \
      (void *to, void const *from, size_t bytes, enum cudaMemcpyKind kind, cudaStream_t stream),             \
      (to, from, bytes, kind, stream), cudaErrorInitializationError)                                         \
    X(runtime, cudaError_t, cudaMemcpyPeerAsync,                                                             \
      (void *to, int to_device, void const *from, int from_device, size_t bytes, cudaStream_t stream),       \
      (to, to_device, from, from_device, bytes, stream), cudaErrorInitializationError)                       \
    X(runtime, cudaError_t, cudaMemset, (void *pointer, int value, size_t bytes), (pointer, value, bytes),   \
      cudaErrorInitializationError)                                                                          \
    X(runtime, cudaError_t, cudaMemsetAsync, (void *pointer, int value, size_t bytes, cudaStream_t stream),  \
      (pointer, value, bytes, stream), cudaErrorInitializationError)                                         \
    X(runtime, cudaError_t, cudaPointerGetAttributes,                                                        \
      (struct cudaPointerAttributes * attributes, void const *pointer), (attributes, pointer),               \
      cudaErrorInitializationError)                                                                          \
    X(runtime, cudaError_t, cudaLaunchKernel,                                                                \
      (void const *function, dim3 grid, dim3 block, void **args, size_t shared, cudaStream_t stream),        \
      (function, grid, block, args, shared, stream), cudaErrorInitializationError)                           \
    X(runtime, unsigned, __cudaPushCallConfiguration,                                                        \
      (dim3 grid, dim3 block, size_t shared, struct CUstream_st * stream), (grid, block, shared, stream),    \
      1u)                                                                                                    \
    X(runtime, cudaError_t, __cudaPopCallConfiguration,                                                      \
      (dim3 * grid, dim3 * block, size_t * shared, void *stream), (grid, block, shared, stream),             \
      cudaErrorInitializationError)                                                                          \
    CUDA_RUNTIME_LAUNCH(X)

#if CUDART_VERSION >= 13000
#define CUDA_RUNTIME_LAUNCH(X)                                                                               \
    X(runtime, cudaError_t, __cudaGetKernel, (cudaKernel_t * kernel, void const *function),                  \
      (kernel, function), cudaErrorInitializationError)                                                      \
    X(runtime, cudaError_t, __cudaLaunchKernel,                                                              \
      (cudaKernel_t kernel, dim3 grid, dim3 block, void **args, size_t shared, cudaStream_t stream),         \
      (kernel, grid, block, args, shared, stream), cudaErrorInitializationError)
#else
#define CUDA_RUNTIME_LAUNCH(X)
#endif

#define CUBLASLT_CALLS(X)                                                                                    \
    X(blas, cublasStatus_t, cublasLtCreate, (cublasLtHandle_t * handle), (handle),                           \
      CUBLAS_STATUS_NOT_INITIALIZED)                                                                         \
    X(blas, cublasStatus_t, cublasLtDestroy, (cublasLtHandle_t handle), (handle),                            \
      CUBLAS_STATUS_NOT_INITIALIZED)                                                                         \
    X(blas, cublasStatus_t, cublasLtMatmul,                                                                  \
      (cublasLtHandle_t handle, cublasLtMatmulDesc_t operation, void const *alpha, void const *a,            \
       cublasLtMatrixLayout_t a_layout, void const *b, cublasLtMatrixLayout_t b_layout, void const *beta,    \
       void const *c, cublasLtMatrixLayout_t c_layout, void *d, cublasLtMatrixLayout_t d_layout,             \
       cublasLtMatmulAlgo_t const *algo, void *workspace, size_t workspace_bytes, cudaStream_t stream),      \
      (handle, operation, alpha, a, a_layout, b, b_layout, beta, c, c_layout, d, d_layout, algo, workspace,  \
       workspace_bytes, stream),                                                                             \
      CUBLAS_STATUS_NOT_INITIALIZED)                                                                         \
    X(blas, cublasStatus_t, cublasLtMatmulAlgoGetHeuristic,                                                  \
      (cublasLtHandle_t handle, cublasLtMatmulDesc_t operation, cublasLtMatrixLayout_t a,                    \
       cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,                         \
       cublasLtMatmulPreference_t preference, int requested, cublasLtMatmulHeuristicResult_t results[],      \
       int *returned),                                                                                       \
      (handle, operation, a, b, c, d, preference, requested, results, returned),                             \
      CUBLAS_STATUS_NOT_INITIALIZED)                                                                         \
    X(blas, cublasStatus_t, cublasLtMatmulDescCreate,                                                        \
      (cublasLtMatmulDesc_t * operation, cublasComputeType_t compute, cudaDataType_t scale),                 \
      (operation, compute, scale), CUBLAS_STATUS_NOT_INITIALIZED)                                            \
    X(blas, cublasStatus_t, cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t operation), (operation),        \
      CUBLAS_STATUS_NOT_INITIALIZED)                                                                         \
    X(blas, cublasStatus_t, cublasLtMatmulDescSetAttribute,                                                  \
      (cublasLtMatmulDesc_t operation, cublasLtMatmulDescAttributes_t attribute, void const *value,          \
       size_t bytes),                                                                                        \
      (operation, attribute, value, bytes), CUBLAS_STATUS_NOT_INITIALIZED)                                   \
    X(blas, cublasStatus_t, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * preference),       \
      (preference), CUBLAS_STATUS_NOT_INITIALIZED)                                                           \
    X(blas, cublasStatus_t, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t preference),        \
      (preference), CUBLAS_STATUS_NOT_INITIALIZED)                                                           \
    X(blas, cublasStatus_t, cublasLtMatmulPreferenceSetAttribute,                                            \
      (cublasLtMatmulPreference_t preference, cublasLtMatmulPreferenceAttributes_t attribute,                \
       void const *value, size_t bytes),                                                                     \
      (preference, attribute, value, bytes), CUBLAS_STATUS_NOT_INITIALIZED)                                  \
    X(blas, cublasStatus_t, cublasLtMatrixLayoutCreate,                                                      \
      (cublasLtMatrixLayout_t * layout, cudaDataType type, uint64_t rows, uint64_t columns,                  \
       int64_t leading),                                                                                     \
      (layout, type, rows, columns, leading), CUBLAS_STATUS_NOT_INITIALIZED)                                 \
    X(blas, cublasStatus_t, cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t layout), (layout),          \
      CUBLAS_STATUS_NOT_INITIALIZED)

/* The registration calls replayed at a load: the runtime's own, beside the recording ones below. */
#define CUDA_REGISTER_CALLS(X)                                                                               \
    X(runtime, void **, __cudaRegisterFatBinary, (void *fatbin), (fatbin), NULL)                             \
    X(runtime, void, __cudaRegisterFatBinaryEnd, (void **handle), (handle), )                                \
    X(runtime, void, __cudaUnregisterFatBinary, (void **handle), (handle), )                                 \
    X(runtime, void, __cudaRegisterFunction,                                                                 \
      (void **handle, char const *host, char *device, char const *name, int thread_limit, uint3 *tid,        \
       uint3 *bid, dim3 *block, dim3 *grid, int *warp),                                                      \
      (handle, host, device, name, thread_limit, tid, bid, block, grid, warp), )                             \
    X(runtime, void, __cudaRegisterVar,                                                                      \
      (void **handle, char *host, char *device, char const *name, int ext, size_t size, int constant,        \
       int global),                                                                                          \
      (handle, host, device, name, ext, size, constant, global), )

static char const not_loaded_name[] = "cudaErrorNotLoaded";
static char const not_loaded_text[] = "the CUDA runtime is not loaded: no VRAM executor was made";

#define API_MEMBER(library, type, name, parameters, arguments, refusal) type(CUDARTAPI *name) parameters;

/* The libraries' entry points, once loaded. */
static struct {
    CUDA_RUNTIME_CALLS(API_MEMBER)
    CUBLASLT_CALLS(API_MEMBER)
    CUDA_REGISTER_CALLS(API_MEMBER)
} api;

static _Atomic bool loaded;
static pthread_mutex_t loading = PTHREAD_MUTEX_INITIALIZER;

#define FORWARD(library, type, name, parameters, arguments, refusal)                                         \
    HIDDEN type CUDARTAPI name parameters {                                                                  \
        if (!atomic_load_explicit(&loaded, memory_order_acquire)) return refusal;                            \
        return api.name arguments;                                                                           \
    }

CUDA_RUNTIME_CALLS(FORWARD)
CUBLASLT_CALLS(FORWARD)

/* ---- The record of registrations ---------------------------------------------------------------- */

typedef enum registration_kind { REGISTERED_FUNCTION, REGISTERED_VARIABLE } registration_kind_t;

/* One __cudaRegisterFunction or __cudaRegisterVar call, as made. */
typedef struct registration {
    registration_kind_t kind;
    size_t fatbin;
    char *host, *device;
    char const *name;
    int thread_limit; /* functions */
    uint3 *tid, *bid;
    dim3 *block, *grid;
    int *warp;
    int ext, constant, global; /* variables */
    size_t size;
} registration_t;

/* One __cudaRegisterFatBinary call: its handle (what nvcc's code holds) is &runtime, which holds the
 * runtime's handle once replayed. */
typedef struct fatbin {
    void **runtime;
    void *image;
    bool ended, unregistered;
} fatbin_t;

static fatbin_t fatbins[CUDA_FATBINS];
static size_t fatbins_count;
static registration_t registrations[CUDA_REGISTRATION];
static size_t registrations_count;
static bool overflow;

static fatbin_t *fatbin_of(void **handle) {
    for (size_t i = 0; i < fatbins_count; ++i)
        if ((void *)&fatbins[i].runtime == (void *)handle) return &fatbins[i];
    return NULL;
}

/* The slot of the next registration of `handle`'s fatbin, or NULL (counted as overflow). */
static registration_t *registration_next(void **handle) {
    fatbin_t *fatbin = fatbin_of(handle);
    if (!fatbin || registrations_count == CUDA_REGISTRATION) {
        overflow = true;
        return NULL;
    }
    registration_t *registration = &registrations[registrations_count++];
    memset(registration, 0, sizeof *registration);
    registration->fatbin = (size_t)(fatbin - fatbins);
    return registration;
}

/* The registration functions run from constructors, before main, on one thread; a load replays them
 * under `loading`, as does an unregistration. */
HIDDEN void **CUDARTAPI __cudaRegisterFatBinary(void *image) {
    static void *refused;
    if (fatbins_count == CUDA_FATBINS) {
        overflow = true;
        return &refused;
    }
    fatbin_t *fatbin = &fatbins[fatbins_count++];
    *fatbin = (fatbin_t){.image = image};
    return (void **)(void *)&fatbin->runtime;
}

HIDDEN void CUDARTAPI __cudaRegisterFunction(void **handle, char const *host, char *device, char const *name,
                                             int thread_limit, uint3 *tid, uint3 *bid, dim3 *block,
                                             dim3 *grid, int *warp) {
    registration_t *registration = registration_next(handle);
    if (!registration) return;
    registration->kind = REGISTERED_FUNCTION;
    registration->host = (char *)host;
    registration->device = device;
    registration->name = name;
    registration->thread_limit = thread_limit;
    registration->tid = tid, registration->bid = bid;
    registration->block = block, registration->grid = grid;
    registration->warp = warp;
}

HIDDEN void CUDARTAPI __cudaRegisterVar(void **handle, char *host, char *device, char const *name, int ext,
                                        size_t size, int constant, int global) {
    registration_t *registration = registration_next(handle);
    if (!registration) return;
    registration->kind = REGISTERED_VARIABLE;
    registration->host = host;
    registration->device = device;
    registration->name = name;
    registration->ext = ext, registration->size = size;
    registration->constant = constant, registration->global = global;
}

HIDDEN void CUDARTAPI __cudaRegisterFatBinaryEnd(void **handle) {
    fatbin_t *fatbin = fatbin_of(handle);
    if (fatbin) fatbin->ended = true;
}

HIDDEN void CUDARTAPI __cudaUnregisterFatBinary(void **handle) {
    pthread_mutex_lock(&loading);
    fatbin_t *fatbin = fatbin_of(handle);
    if (fatbin && !fatbin->unregistered) {
        fatbin->unregistered = true;
        if (fatbin->runtime) api.__cudaUnregisterFatBinary(fatbin->runtime);
        fatbin->runtime = NULL;
    }
    pthread_mutex_unlock(&loading);
}

/* Registers every recorded fatbin with the runtime just opened, in the recorded order. */
static void registrations_replay(void) {
    for (size_t f = 0; f < fatbins_count; ++f) {
        fatbin_t *fatbin = &fatbins[f];
        if (fatbin->unregistered) continue;
        fatbin->runtime = api.__cudaRegisterFatBinary(fatbin->image);
        for (size_t i = 0; i < registrations_count; ++i) {
            registration_t const *r = &registrations[i];
            if (r->fatbin != f) continue;
            if (r->kind == REGISTERED_FUNCTION)
                api.__cudaRegisterFunction(fatbin->runtime, r->host, r->device, r->name, r->thread_limit,
                                           r->tid, r->bid, r->block, r->grid, r->warp);
            else
                api.__cudaRegisterVar(fatbin->runtime, r->host, r->device, r->name, r->ext, r->size,
                                      r->constant, r->global);
        }
        if (fatbin->ended) api.__cudaRegisterFatBinaryEnd(fatbin->runtime);
    }
}

cuda_library_registered_t cuda_library_registrations(void) {
    cuda_library_registered_t registered = {.fatbins = fatbins_count, .overflow = overflow};
    for (size_t i = 0; i < registrations_count; ++i)
        ++*(registrations[i].kind == REGISTERED_FUNCTION ? &registered.functions : &registered.variables);
    return registered;
}

/* ---- Loading ------------------------------------------------------------------------------------ */

cuda_library_names_t const cuda_library_sonames = {
    .driver = DRIVER_SONAME,
    .runtime = UFORM_CUDART_SONAME,
    .blas = UFORM_CUBLASLT_SONAME,
};

static void *handles[3]; /* the driver, the runtime, cuBLASLt: open while loaded */

/* Resolves every entry point of `library` into `api`. false when one is missing. */
static bool api_resolve(void *runtime, void *blas) {
    bool found = true;
#define RESOLVE(library, type, name, parameters, arguments, refusal)                                         \
    found = found && (*(void **)(void *)&api.name = dlsym(library, SYMBOL(name))) != NULL;
    CUDA_RUNTIME_CALLS(RESOLVE)
    CUDA_REGISTER_CALLS(RESOLVE)
    CUBLASLT_CALLS(RESOLVE)
#undef RESOLVE
    return found;
}

/* Closes what a failed load opened, and forgets its entry points. */
static void handles_close(void) {
    for (size_t i = 3; i-- > 0;)
        if (handles[i]) dlclose(handles[i]);
    memset(handles, 0, sizeof handles);
    memset(&api, 0, sizeof api);
}

/* The load itself, under `loading`. */
static bool library_open(cuda_library_names_t const *names, char const **message) {
    static char const *const missing[] = {
        "cannot load " DRIVER_SONAME ", the NVIDIA driver: no driver is installed",
        "cannot load " UFORM_CUDART_SONAME ", the CUDA runtime the engine was built with",
        "cannot load " UFORM_CUBLASLT_SONAME ", the cuBLASLt the engine was built with",
    };
    char const *const sonames[] = {names->driver, names->runtime, names->blas};
    if (overflow) return *message = "kernels/cuda registers more kernels than cuda_library.c records", false;
    for (size_t i = 0; i < 3; ++i)
        if (!(handles[i] = dlopen(sonames[i], RTLD_NOW | RTLD_LOCAL))) {
            handles_close();
            return *message = missing[i], false;
        }
    if (!api_resolve(handles[1], handles[2])) {
        handles_close();
        return *message = "the CUDA runtime or cuBLASLt lacks an entry point the engine calls", false;
    }
    registrations_replay();
    return true;
}

bool cuda_library_load_from(cuda_library_names_t const *names, char const **message) {
    if (atomic_load_explicit(&loaded, memory_order_acquire)) return true;
    pthread_mutex_lock(&loading);
    bool ok = atomic_load_explicit(&loaded, memory_order_relaxed) || library_open(names, message);
    atomic_store_explicit(&loaded, ok, memory_order_release);
    pthread_mutex_unlock(&loading);
    return ok;
}

bool cuda_library_load(char const **message) {
    return cuda_library_load_from(&cuda_library_sonames, message);
}

bool cuda_library_loaded(void) {
    return atomic_load_explicit(&loaded, memory_order_acquire);
}

/* ---- NCCL ----------------------------------------------------------------------------------------- */

#if UFORM_WITH_NCCL
static char const nccl_not_loaded[] = "NCCL is not loaded: no mesh over VRAM executors asked for it";

/* X(library, type, name, parameters, arguments, answer before a load) for every NCCL function forwarded. */
#define NCCL_CALLS(X)                                                                                        \
    X(nccl, ncclResult_t, ncclGetVersion, (int *version), (version), ncclInvalidUsage)                       \
    X(nccl, ncclResult_t, ncclGetUniqueId, (ncclUniqueId * id), (id), ncclInvalidUsage)                      \
    X(nccl, ncclResult_t, ncclCommInitRankConfig,                                                            \
      (ncclComm_t * comm, int ranks, ncclUniqueId id, int rank, ncclConfig_t *config),                       \
      (comm, ranks, id, rank, config), ncclInvalidUsage)                                                     \
    X(nccl, ncclResult_t, ncclCommGetAsyncError, (ncclComm_t comm, ncclResult_t * error), (comm, error),     \
      ncclInvalidUsage)                                                                                      \
    X(nccl, ncclResult_t, ncclCommAbort, (ncclComm_t comm), (comm), ncclInvalidUsage)                        \
    X(nccl, ncclResult_t, ncclCommFinalize, (ncclComm_t comm), (comm), ncclInvalidUsage)                     \
    X(nccl, ncclResult_t, ncclCommDestroy, (ncclComm_t comm), (comm), ncclInvalidUsage)                      \
    X(nccl, ncclResult_t, ncclAllReduce,                                                                     \
      (void const *send, void *receive, size_t count, ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,  \
       cudaStream_t stream),                                                                                 \
      (send, receive, count, type, op, comm, stream), ncclInvalidUsage)                                      \
    X(nccl, ncclResult_t, ncclAllGather,                                                                     \
      (void const *send, void *receive, size_t count, ncclDataType_t type, ncclComm_t comm,                  \
       cudaStream_t stream),                                                                                 \
      (send, receive, count, type, comm, stream), ncclInvalidUsage)                                          \
    X(nccl, ncclResult_t, ncclBroadcast,                                                                     \
      (void const *send, void *receive, size_t count, ncclDataType_t type, int root, ncclComm_t comm,        \
       cudaStream_t stream),                                                                                 \
      (send, receive, count, type, root, comm, stream), ncclInvalidUsage)                                    \
    X(nccl, ncclResult_t, ncclGroupStart, (void), (), ncclInvalidUsage)                                      \
    X(nccl, ncclResult_t, ncclGroupEnd, (void), (), ncclInvalidUsage)                                        \
    X(nccl, char const *, ncclGetErrorString, (ncclResult_t result), (result), nccl_not_loaded)

/* nccl.h declares these two without a prototype, `()`. */
HIDDEN ncclResult_t ncclGroupStart(void);
HIDDEN ncclResult_t ncclGroupEnd(void);

static struct { NCCL_CALLS(API_MEMBER) } nccl_api;

static _Atomic bool nccl_loaded;
static void *nccl_handle;

#define NCCL_FORWARD(library, type, name, parameters, arguments, refusal)                                    \
    HIDDEN type name parameters {                                                                            \
        if (!atomic_load_explicit(&nccl_loaded, memory_order_acquire)) return refusal;                       \
        return nccl_api.name arguments;                                                                      \
    }

NCCL_CALLS(NCCL_FORWARD)

char const *const cuda_library_nccl_soname = UFORM_NCCL_SONAME;

/* The load itself, under `loading`, the runtime loaded. */
static bool nccl_open(char const *soname, char const **message) {
    if (!(nccl_handle = dlopen(soname, RTLD_NOW | RTLD_LOCAL)))
        return *message = "cannot load " UFORM_NCCL_SONAME ", the NCCL the engine was built with", false;
    bool found = true;
#define NCCL_RESOLVE(library, type, name, parameters, arguments, refusal)                                    \
    found = found && (*(void **)(void *)&nccl_api.name = dlsym(nccl_handle, #name)) != NULL;
    NCCL_CALLS(NCCL_RESOLVE)
#undef NCCL_RESOLVE
    if (found) return true;
    dlclose(nccl_handle);
    nccl_handle = NULL;
    memset(&nccl_api, 0, sizeof nccl_api);
    return *message = "the NCCL found lacks an entry point the engine calls", false;
}

bool cuda_library_load_nccl_from(char const *soname, char const **message) {
    if (atomic_load_explicit(&nccl_loaded, memory_order_acquire)) return true;
    if (!cuda_library_loaded())
        return *message = "NCCL is opened after the CUDA runtime: no VRAM executor was made", false;
    pthread_mutex_lock(&loading);
    bool ok = atomic_load_explicit(&nccl_loaded, memory_order_relaxed) || nccl_open(soname, message);
    atomic_store_explicit(&nccl_loaded, ok, memory_order_release);
    pthread_mutex_unlock(&loading);
    return ok;
}

bool cuda_library_nccl_loaded(void) {
    return atomic_load_explicit(&nccl_loaded, memory_order_acquire);
}
#else
char const *const cuda_library_nccl_soname = NULL;

bool cuda_library_load_nccl_from(char const *soname, char const **message) {
    (void)soname;
    return *message = "built without NCCL (the `nccl` feature)", false;
}

bool cuda_library_nccl_loaded(void) {
    return false;
}
#endif

bool cuda_library_load_nccl(char const **message) {
    return cuda_library_load_nccl_from(cuda_library_nccl_soname, message);
}
