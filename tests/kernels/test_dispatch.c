/* The dispatcher's rule (kernels_rule) over CPUs described by hand: vendor and the paths they run, newest
 * first, against the path and reason each must get; then this process's own choice (kernels_active,
 * kernels_reason) against the rule over this CPU, or against UFORM_KERNELS where it is set: meson runs this
 * program without it, with a path every CPU runs (scalar), and with a name no build has. No timing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kernels.h"

#define COUNT(array) (sizeof(array) / sizeof((array)[0]))

/* The rule's answer for `vendor` and `runs` (NULL-terminated), checked to come with a reason. */
static char const *rule(kernels_vendor_t vendor, char const *const *runs, char const **reason) {
    kernels_cpu_t const cpu = {.vendor = vendor, .runs = runs};
    *reason = NULL;
    char const *name = kernels_rule(&cpu, reason);
    assert_non_null(*reason);
    return name;
}

/* `reason` opens with "name: ", as every reason of a path the rule knows does. */
static void assert_reason_names(char const *reason, char const *name) {
    size_t length = strlen(name);
    assert_true(strncmp(reason, name, length) == 0 && reason[length] == ':');
}

/* The x86 paths of a CPU with AVX512-BF16, newest first, as built_paths lists them. */
static char const *const avx512bf16_cpu[] = {"avx512bf16", "avx512vnni", "avx512", "avxvnni",
                                             "avx2",       "scalar",     NULL};

static void intel_with_avx512bf16_takes_the_fma_gemm(void **state) {
    (void)state;
    char const *reason;
    assert_string_equal(rule(KERNELS_VENDOR_INTEL, avx512bf16_cpu, &reason), "avx512vnni");
    assert_reason_names(reason, "avx512vnni");
    assert_non_null(strstr(reason, "Intel"));
}

static void amd_with_avx512bf16_takes_vdpbf16ps(void **state) {
    (void)state;
    char const *reason;
    assert_string_equal(rule(KERNELS_VENDOR_AMD, avx512bf16_cpu, &reason), "avx512bf16");
    assert_reason_names(reason, "avx512bf16");
    assert_string_equal(rule(KERNELS_VENDOR_OTHER, avx512bf16_cpu, &reason), "avx512bf16");
}

/* AMX, where a build has it and the CPU runs it, is first in the build's order and always taken. */
static void amx_is_taken_wherever_it_runs(void **state) {
    (void)state;
    static char const *const amx_cpu[] = {"amx",  "avx512bf16", "avx512vnni", "avx512",
                                          "avx2", "scalar",     NULL};
    char const *reason;
    assert_string_equal(rule(KERNELS_VENDOR_INTEL, amx_cpu, &reason), "amx");
    assert_reason_names(reason, "amx");
    assert_string_equal(rule(KERNELS_VENDOR_AMD, amx_cpu, &reason), "amx");
}

/* The exception needs the faster path to run: else the newest is taken. */
static void an_exception_needs_its_path(void **state) {
    (void)state;
    static char const *const bf16_only[] = {"avx512bf16", "scalar", NULL};
    char const *reason;
    assert_string_equal(rule(KERNELS_VENDOR_INTEL, bf16_only, &reason), "avx512bf16");
    assert_reason_names(reason, "avx512bf16");
}

/* Without AVX512-BF16 the newest path the CPU runs is the fastest, whatever the vendor. */
static void other_cpus_take_their_newest_path(void **state) {
    (void)state;
    static struct {
        kernels_vendor_t vendor;
        char const *runs[7], *expected;
    } const cases[] = {
        {KERNELS_VENDOR_INTEL, {"avx512vnni", "avx512", "avx2", "scalar"}, "avx512vnni"},
        {KERNELS_VENDOR_INTEL, {"avx512", "avx2", "scalar"}, "avx512"},
        {KERNELS_VENDOR_INTEL, {"avxvnni", "avx2", "scalar"}, "avxvnni"},
        {KERNELS_VENDOR_AMD, {"avx2", "scalar"}, "avx2"},
        {KERNELS_VENDOR_OTHER, {"neoni8mm", "neondot", "neon", "scalar"}, "neoni8mm"},
        {KERNELS_VENDOR_OTHER, {"neondot", "neon", "scalar"}, "neondot"},
        {KERNELS_VENDOR_OTHER, {"neon", "scalar"}, "neon"},
        {KERNELS_VENDOR_OTHER, {"scalar"}, "scalar"},
    };
    for (size_t i = 0; i < COUNT(cases); ++i) {
        char const *reason;
        assert_string_equal(rule(cases[i].vendor, cases[i].runs, &reason), cases[i].expected);
        assert_reason_names(reason, cases[i].expected);
    }
}

/* A path the rule has no reason of its own for is still taken when newest; no path at all gives NULL. */
static void unknown_and_empty_descriptions(void **state) {
    (void)state;
    static char const *const unknown[] = {"future", "scalar", NULL};
    static char const *const empty[] = {NULL};
    char const *reason;
    assert_string_equal(rule(KERNELS_VENDOR_INTEL, unknown, &reason), "future");
    assert_null(rule(KERNELS_VENDOR_INTEL, empty, &reason));
}

/* ---- This process ------------------------------------------------------------------------------ */

/* What the rule takes on this CPU: the paths kernels_active may choose, in the build's order (amx, which only
 * UFORM_KERNELS takes, not among them). */
static char const *this_cpu_rule(char const **reason) {
    static char const *const order[] = {"avx512bf16", "avx512vnni", "avx512", "avxvnni", "avx2",
                                        "neoni8mm",   "neondot",    "neon",   "scalar"};
    char const *runs[COUNT(order) + 1] = {NULL};
    size_t count = 0;
    for (size_t i = 0; i < COUNT(order); ++i)
        if (kernels_named(order[i]) || !strcmp(order[i], "scalar")) runs[count++] = order[i];
    return rule(kernels_cpu_vendor(), runs, reason);
}

static void this_process_follows_the_rule_or_the_override(void **state) {
    (void)state;
    char const *override = getenv("UFORM_KERNELS"), *rule_reason;
    char const *expected = this_cpu_rule(&rule_reason);
    kernels_t const *active = kernels_active();
    assert_non_null(active);
    if (override && (kernels_named(override) || !strcmp(override, "scalar")) &&
        strcmp(override, "avxvnni_evex")) {
        assert_string_equal(active->name, override);
        assert_string_equal(kernels_reason(), "UFORM_KERNELS");
        return;
    }
    assert_string_equal(active->name, expected);
    if (override && *override) { /* refused: the rule's reason, then the name it refused */
        assert_true(strncmp(kernels_reason(), rule_reason, strlen(rule_reason)) == 0);
        assert_non_null(strstr(kernels_reason(), override));
    } else {
        assert_string_equal(kernels_reason(), rule_reason);
    }
    assert_ptr_equal(kernels_active(), active); /* kept for the process */
}

int main(void) {
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(intel_with_avx512bf16_takes_the_fma_gemm),
        cmocka_unit_test(amd_with_avx512bf16_takes_vdpbf16ps),
        cmocka_unit_test(amx_is_taken_wherever_it_runs),
        cmocka_unit_test(an_exception_needs_its_path),
        cmocka_unit_test(other_cpus_take_their_newest_path),
        cmocka_unit_test(unknown_and_empty_descriptions),
        cmocka_unit_test(this_process_follows_the_rule_or_the_override),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
