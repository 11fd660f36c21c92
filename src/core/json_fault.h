/* What a failed jansson load says. jansson sets its error (text, line, code) for every fault it finds in
 * the text, but when an object or an array (or the lexer's buffer) cannot be allocated it answers NULL
 * with the error as json_load* began it: the text empty and the code, kept in the text's last byte, never
 * written. Reading that code is reading stack garbage, so every caller asks here first. */
#pragma once

#include <stdbool.h>

#include <jansson.h>

/* Whether the load failed without saying why: an allocation failed. */
static inline bool json_fault_unsaid(json_error_t const *error) {
    return error->text[0] == '\0';
}

/* Whether the load failed for memory: unsaid, or said so. */
static inline bool json_fault_memory(json_error_t const *error) {
    return json_fault_unsaid(error) || json_error_code(error) == json_error_out_of_memory;
}
