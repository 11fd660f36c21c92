#include "json_faults.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>

static size_t counted, fail_at;

static bool buffer_growth(size_t size) {
    return size >= 32 && (size & (size - 1)) == 0;
}

static void *failing_malloc(size_t size) {
    if (buffer_growth(size)) return malloc(size);
    return ++counted == fail_at ? NULL : malloc(size);
}

void json_fail_allocation(size_t nth) {
    counted = 0, fail_at = nth;
    json_set_alloc_funcs(failing_malloc, free);
}

size_t json_allocations_counted(void) {
    return counted;
}

void json_allocations_restore(void) {
    json_set_alloc_funcs(malloc, free);
}
