/* Chooses the kernel path once per process: UFORM_KERNELS when the CPU can run it, else the fastest one
 * the CPU runs by a fixed rule over its vendor and the paths it runs (kernels_rule), never by a measurement
 * at run time, so that every process on one machine computes the same bits. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "paths.h"

/* A path's table: its name, then the path whose GEMM, whose vector kernels (the forward ones, quantize_rows,
 * the F32 GEMM and the backward ones but attention's), whose attention, convert, attention backward and I8
 * GEMM it takes, each named by its suffix; rope is the scalar one on every path (the rotation is
 * memory-bound). Initialisers only. */
#define PATH_TABLE(label, gemm_path, vector_path, attention_path, convert_path, attention_backward_path,     \
                   i8_path)                                                                                  \
    {                                                                                                        \
        .name = label, .gemm = kernel_gemm_##gemm_path,                                                      \
        .gemm_packed_size = kernel_gemm_packed_size_##gemm_path, .gemm_pack = kernel_gemm_pack_##gemm_path,  \
        .rmsnorm = kernel_rmsnorm_##vector_path, .layernorm = kernel_layernorm_##vector_path,                \
        .rope = kernel_rope_scalar, .attention = kernel_attention_##attention_path,                          \
        .softmax = kernel_softmax_##vector_path, .normalize = kernel_normalize_##vector_path,                \
        .convert = kernel_convert_##convert_path, .bf16_to_f32 = kernel_bf16_to_f32_##vector_path,           \
        .f32_to_bf16 = kernel_f32_to_bf16_##vector_path, .sgemm = kernel_sgemm_##vector_path,                \
        .rmsnorm_backward = kernel_rmsnorm_backward_##vector_path,                                           \
        .gelu_backward = kernel_gelu_backward_##vector_path, .gelu = kernel_gelu_##vector_path,              \
        .rope_backward = kernel_rope_backward_scalar,                                                        \
        .attention_backward = kernel_attention_backward_##attention_backward_path,                           \
        .quantize_rows = kernel_quantize_rows_##vector_path, .gemm_i8 = kernel_gemm_i8_##i8_path,            \
        .gemm_i8_packed_size = kernel_gemm_i8_packed_size_##i8_path,                                         \
        .gemm_i8_pack = kernel_gemm_i8_pack_##i8_path, .quantize_weights = QUANTIZE_WEIGHTS_##vector_path,   \
        .attention_f32 = kernel_attention_##vector_path                                                      \
    }

/* A path's quantize_weights, by the suffix of its vector kernels: the scalar reference where the path has
 * none of its own. */
#define QUANTIZE_WEIGHTS_scalar kernel_quantize_weights
#define QUANTIZE_WEIGHTS_avx2   kernel_quantize_weights_avx2
#define QUANTIZE_WEIGHTS_avx512 kernel_quantize_weights_avx512
#define QUANTIZE_WEIGHTS_neon   kernel_quantize_weights

static kernels_t const scalar_path = PATH_TABLE("scalar", scalar, scalar, scalar, scalar, scalar, scalar);

kernels_t const *kernels_scalar(void) {
    return &scalar_path;
}

/* Every CPU runs the scalar path, and every AArch64 CPU the neon one. */
static bool cpu_any(void) {
    return true;
}

#if defined(__x86_64__)
#include <cpuid.h>
#include <errno.h>
#include <stdio.h>
#if UFORM_LINUX /* the POSIX-only build asks for no tiles */
#include <sys/syscall.h>
#include <unistd.h>
#endif

static kernels_t const amx_path = PATH_TABLE("amx", amx, avx512, avx512bf16, avx512, avx512, amx);

static kernels_t const avx2_path = PATH_TABLE("avx2", avx2, avx2, avx2, scalar, avx2, avx2);

static kernels_t const avxvnni_path = PATH_TABLE("avxvnni", avx2, avx2, avx2, scalar, avx2, avxvnni);

/* AVX-512 without VNNI (Skylake-SP) takes the AVX2 I8 GEMM. */
static kernels_t const avx512_path = PATH_TABLE("avx512", avx512, avx512, avx512, avx512, avx512, avx2);

static kernels_t const avx512vnni_path =
    PATH_TABLE("avx512vnni", avx512, avx512, avx512, avx512, avx512, avx512vnni);

static kernels_t const avx512bf16_path =
    PATH_TABLE("avx512bf16", avx512bf16, avx512, avx512bf16, avx512, avx512, avx512vnni);

static kernels_t const avxvnni_evex_path =
    PATH_TABLE("avxvnni_evex", avx512, avx512, avx512, avx512, avx512, avxvnni_evex);

static bool cpu_has_avx2(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* AVX-VNNI is CPUID.(EAX=7, ECX=1):EAX bit 4: clang 14's __builtin_cpu_supports has no name for it. */
static bool cpu_has_avxvnni(void) {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return cpu_has_avx2() && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 4));
}

static bool cpu_has_avx512(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
}

static bool cpu_has_avx512vnni(void) {
    return cpu_has_avx512() && __builtin_cpu_supports("avx512vnni");
}

static bool cpu_has_avx512bf16(void) {
    return cpu_has_avx512vnni() && __builtin_cpu_supports("avx512bf16");
}

/* AMX's tiles (gemm_amx.c) run where the CPU has them (CPUID.(EAX=7, ECX=0):EDX bits 24 AMX-TILE, 22
 * AMX-BF16 and 25 AMX-INT8, and a palette in leaf 0x1D), the OS saves them (XCR0 bits 17 XTILECFG and 18
 * XTILEDATA) and Linux lets this process use them: asked once, ARCH_REQ_XCOMP_PERM for XTILEDATA, before
 * any tile instruction (without it the first one raises SIGILL). The path's other kernels are avx512's
 * but its attention, avx512bf16's, with AVX512-BF16 for its activations' rounding. Whatever fails leaves the
 * path out and says why in amx_state (kernels_amx_state). */
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static bool amx_enabled;
static char amx_state[160];

/* XCR0, the state components the OS saves (XGETBV needs CPUID.1:ECX bit 27, OSXSAVE). */
static uint64_t xcr0(void) {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx) || !(ecx & (1u << 27))) return 0;
    uint32_t low, high;
    __asm__ volatile("xgetbv" : "=a"(low), "=d"(high) : "c"(0));
    return (uint64_t)high << 32 | low;
}

static void amx_enable(void) {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) edx = 0;
    bool tile = edx & (1u << 24), bf16 = edx & (1u << 22), int8 = edx & (1u << 25);
    if (!tile || !bf16 || !int8) {
        snprintf(amx_state, sizeof amx_state, "amx: not on this CPU (it lacks%s%s%s)",
                 tile ? "" : " amx_tile", bf16 ? "" : " amx_bf16", int8 ? "" : " amx_int8");
        return;
    }
    if (!__get_cpuid_count(0x1d, 0, &eax, &ebx, &ecx, &edx) || eax < 1) {
        snprintf(amx_state, sizeof amx_state, "amx: not on this CPU (CPUID reports no tile palette)");
        return;
    }
    if (!cpu_has_avx512bf16()) {
        snprintf(amx_state, sizeof amx_state, "amx: not run on this CPU (it lacks AVX512-BF16)");
        return;
    }
    if ((xcr0() & (3u << 17)) != (3u << 17)) {
        snprintf(amx_state, sizeof amx_state, "amx: not enabled by the OS (XCR0 lacks XTILECFG, XTILEDATA)");
        return;
    }
#if UFORM_LINUX
    if (syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) != 0) {
        int error = errno;
        snprintf(amx_state, sizeof amx_state, "amx: refused by the kernel (errno %d: %s)", error,
                 strerror(error));
        return;
    }
    amx_enabled = true;
    snprintf(amx_state, sizeof amx_state, "amx: enabled");
#else
    snprintf(amx_state, sizeof amx_state, "amx: not enabled (only the Linux build asks the kernel for the tiles)");
#endif
}

static bool cpu_has_amx(void) {
    pthread_once(&amx_once, amx_enable);
    return amx_enabled;
}

char const *kernels_amx_state(void) {
    pthread_once(&amx_once, amx_enable);
    return amx_state;
}
#else
char const *kernels_amx_state(void) {
    return "amx: not on this CPU (not x86-64)";
}
#endif

#if defined(__aarch64__)

#if defined(__linux__)
#include <sys/auxv.h>

static bool cpu_has_neon_dot(void) {
    return getauxval(AT_HWCAP) & HWCAP_ASIMDDP;
}

static bool cpu_has_neon_i8mm(void) {
    return getauxval(AT_HWCAP2) & HWCAP2_I8MM;
}
#elif defined(__APPLE__)
#include <sys/sysctl.h>

static bool sysctl_flag(char const *name) {
    int value = 0;
    size_t size = sizeof value;
    return sysctlbyname(name, &value, &size, NULL, 0) == 0 && value;
}

static bool cpu_has_neon_dot(void) {
    return sysctl_flag("hw.optional.arm.FEAT_DotProd");
}

static bool cpu_has_neon_i8mm(void) {
    return sysctl_flag("hw.optional.arm.FEAT_I8MM");
}
#else
static bool cpu_has_neon_dot(void) {
    return false;
}

static bool cpu_has_neon_i8mm(void) {
    return false;
}
#endif

/* neoni8mm is neondot with the I8 matrix multiply: it needs both extensions. */
static bool cpu_has_neon_dot_i8mm(void) {
    return cpu_has_neon_dot() && cpu_has_neon_i8mm();
}

/* Advanced SIMD is part of every ARMv8-A CPU that runs Linux: no run-time check. The dot product (SDOT,
 * FEAT_DotProd) and the I8 matrix multiply (SMMLA, FEAT_I8MM) are asked of the kernel (cpu_features). */
static kernels_t const neon_path = PATH_TABLE("neon", neon, neon, neon, scalar, scalar, neon);

static kernels_t const neondot_path = PATH_TABLE("neondot", neon, neon, neon, scalar, scalar, neondot);

static kernels_t const neoni8mm_path = PATH_TABLE("neoni8mm", neon, neon, neon, scalar, scalar, neoni8mm);
#endif

/* Who may take a built path: the rule and UFORM_KERNELS, UFORM_KERNELS alone, or only the tests and
 * benches (kernels_named). */
typedef enum path_use { PATH_CHOSEN, PATH_NAMED, PATH_TESTED } path_use_t;

/* The paths this build has, best first: the order kernels_active tries them in. */
typedef struct built_path {
    kernels_t const *table;
    bool (*runs)(void); /* whether this CPU runs it */
    path_use_t use;
} built_path_t;

/* amx is taken only where UFORM_KERNELS names it: the suite checks its tile kernels against the scalar path
 * wherever the CPU has AMX, but the rule takes a path by measurements, and no bench_gemm figure of these
 * kernels on AMX hardware stands behind it. */
static built_path_t const built_paths[] = {
#if defined(__x86_64__)
    {&amx_path, cpu_has_amx, PATH_NAMED},
    {&avx512bf16_path, cpu_has_avx512bf16, PATH_CHOSEN},
    {&avx512vnni_path, cpu_has_avx512vnni, PATH_CHOSEN},
    {&avx512_path, cpu_has_avx512, PATH_CHOSEN},
    {&avxvnni_path, cpu_has_avxvnni, PATH_CHOSEN},
    {&avx2_path, cpu_has_avx2, PATH_CHOSEN},
    {&avxvnni_evex_path, cpu_has_avx512vnni, PATH_TESTED},
#endif
#if defined(__aarch64__)
    {&neoni8mm_path, cpu_has_neon_dot_i8mm, PATH_CHOSEN},
    {&neondot_path, cpu_has_neon_dot, PATH_CHOSEN},
    {&neon_path, cpu_any, PATH_CHOSEN},
#endif
    {&scalar_path, cpu_any, PATH_CHOSEN},
};

/* The built path called `name` whose use is at most `use` (PATH_TESTED: any), when this CPU runs it. */
static kernels_t const *built_named(char const *name, path_use_t use) {
    for (size_t i = 0; name && i < sizeof built_paths / sizeof built_paths[0]; ++i) {
        built_path_t const *built = &built_paths[i];
        if (strcmp(built->table->name, name) || built->use > use) continue;
        return built->runs() ? built->table : NULL;
    }
    return NULL;
}

kernels_t const *kernels_named(char const *name) {
    return built_named(name, PATH_TESTED);
}

/* ---- The rule --------------------------------------------------------------------------------------
 * The first path of built_paths the CPU runs is the newest; it is taken unless a measured exception below
 * names a faster one for the CPU's vendor. Each reason says what justified the choice. */

/* Where the newest path `newest` loses to `instead` on `vendor`'s CPUs. */
typedef struct kernels_exception {
    kernels_vendor_t vendor;
    char const *newest, *instead, *reason;
} kernels_exception_t;

static kernels_exception_t const exceptions[] = {
    {KERNELS_VENDOR_INTEL, "avx512bf16", "avx512vnni",
     "avx512vnni: its F32 FMA GEMM over widened BF16 outruns vdpbf16ps on Intel CPUs with AVX512-BF16, "
     "which issue one vdpbf16ps per 2 cycles against two FMAs per cycle (bench_gemm at m 512 on a Xeon "
     "with AMX: 330-363 GFLOP/s against 214-230, 2 threads); the same I8 GEMM"},
};

/* Why the newest path is taken where no exception applies. */
static struct {
    char const *name, *reason;
} const newest_reasons[] = {
    {"amx", "amx: the AMX tile GEMMs, preferred wherever the CPU and the kernel run them (an order of "
            "magnitude over the vector paths' peaks)"},
    {"avx512bf16",
     "avx512bf16: its vdpbf16ps GEMM outruns the FMA one where vdpbf16ps issues as often as an "
     "FMA (bench_gemm at m 512 on AMD Zen 4: about 2x avx512's); no measured exception for this "
     "CPU's vendor"},
    {"avx512vnni", "avx512vnni: the widest path this CPU runs (AVX-512 with VNNI, no AVX512-BF16)"},
    {"avx512", "avx512: the widest path this CPU runs (AVX-512 without VNNI)"},
    {"avxvnni", "avxvnni: avx2 with AVX-VNNI's I8 GEMM, vpdpbusd on ymm (bench_gemm on AMD Zen 4, the same "
                "kernel EVEX-encoded: about 3x avx2's vpmaddwd one); the same BF16 GEMM"},
    {"avx2", "avx2: the widest path this CPU runs (AVX2 and FMA)"},
    {"neoni8mm", "neoni8mm: NEON with the I8 matrix multiply's GEMM (SMMLA)"},
    {"neondot", "neondot: NEON with the dot product's I8 GEMM (SDOT)"},
    {"neon", "neon: every AArch64 CPU's path"},
    {"scalar", "scalar: the only path this CPU and build run"},
};

static bool cpu_runs(kernels_cpu_t const *cpu, char const *name) {
    for (char const *const *runs = cpu->runs; *runs; ++runs)
        if (!strcmp(*runs, name)) return true;
    return false;
}

char const *kernels_rule(kernels_cpu_t const *cpu, char const **reason) {
    char const *newest = cpu->runs[0];
    *reason = "the first path in the build's order that this CPU runs";
    if (!newest) return NULL;
    for (size_t i = 0; i < sizeof exceptions / sizeof exceptions[0]; ++i) {
        kernels_exception_t const *exception = &exceptions[i];
        if (exception->vendor != cpu->vendor || strcmp(exception->newest, newest) ||
            !cpu_runs(cpu, exception->instead))
            continue;
        *reason = exception->reason;
        return exception->instead;
    }
    for (size_t i = 0; i < sizeof newest_reasons / sizeof newest_reasons[0]; ++i)
        if (!strcmp(newest_reasons[i].name, newest)) *reason = newest_reasons[i].reason;
    return newest;
}

/* ---- This process's choice ------------------------------------------------------------------------- */

kernels_vendor_t kernels_cpu_vendor(void) {
#if defined(__x86_64__)
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    char vendor[13] = "";
    if (__get_cpuid(0, &eax, &ebx, &ecx, &edx)) {
        memcpy(vendor, &ebx, 4);
        memcpy(vendor + 4, &edx, 4);
        memcpy(vendor + 8, &ecx, 4);
    }
    if (!strcmp(vendor, "GenuineIntel")) return KERNELS_VENDOR_INTEL;
    if (!strcmp(vendor, "AuthenticAMD")) return KERNELS_VENDOR_AMD;
#endif
    return KERNELS_VENDOR_OTHER;
}

#define BUILT_COUNT (sizeof built_paths / sizeof built_paths[0])

static kernels_t const *active;
static char const *active_reason;
static char refused_reason[512]; /* the rule's reason after a UFORM_KERNELS the CPU or build cannot run */
static pthread_once_t active_once = PTHREAD_ONCE_INIT;

static void kernels_choose(void) {
    char const *override = getenv("UFORM_KERNELS");
    active = built_named(override, PATH_NAMED);
    active_reason = "UFORM_KERNELS";
    if (active) return;
    char const *runs[BUILT_COUNT + 1] = {NULL};
    size_t count = 0;
    for (size_t i = 0; i < BUILT_COUNT; ++i)
        if (built_paths[i].use == PATH_CHOSEN && built_paths[i].runs())
            runs[count++] = built_paths[i].table->name;
    kernels_cpu_t const cpu = {.vendor = kernels_cpu_vendor(), .runs = runs};
    active = built_named(kernels_rule(&cpu, &active_reason), PATH_CHOSEN);
    if (override && *override) {
        snprintf(refused_reason, sizeof refused_reason,
                 "%s (UFORM_KERNELS=%.40s refused: not a path this CPU and build run)", active_reason,
                 override);
        active_reason = refused_reason;
    }
}

kernels_t const *kernels_active(void) {
    pthread_once(&active_once, kernels_choose);
    return active;
}

char const *kernels_reason(void) {
    pthread_once(&active_once, kernels_choose);
    return active_reason;
}
