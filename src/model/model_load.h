/* Loading a checkpoint (src/model/model.c) and where its weights go: the load call, and its target.
 *
 * model.c runs the load's state machine and reads the data section in LOAD_READS chunked reads; the
 * target says where each read lands and what happens to it: the host target reads straight into the
 * executor's memory and prepares the towers for the kernels; the VRAM target (src/vram/vram_load.c)
 * reads into pinned staging buffers, copies each to every device while the next reads run, and
 * prepares the towers on the devices. */
#pragma once

#include <sys/stat.h>

#include "call.h"

#define LOAD_CHUNK (1u << 20)
#define LOAD_READS 4

typedef struct load_call load_call_t;

typedef struct load_read {
    loop_op_t op;
    load_call_t *load;
    uint64_t at; /* offset in the data section */
    bool busy;
    bool copying; /* the target still uses the read's buffer (VRAM: copying it to the devices) */
} load_read_t;

/* Where a load puts the weights. Hooks run on the loop thread; `landed`, `pending` and `idle` may be
 * NULL (a target that uses its buffers only while they are read). */
typedef struct model_load_target {
    bool device;        /* loads on VRAM executors only, never mapped */
    size_t state_bytes; /* the target's own state, in load->target_state */
    /* NULL when the target runs the model of `info` (a checkpoint's or a folder's), else a static message
     * for UFORM_UNSUPPORTED. NULL: it runs every model. */
    char const *(*refusal)(uform_model_info_t const *info);
    /* The model is made: allocate its weights, then issue the reads (load_issue_reads), or load_fail. */
    void (*weights)(load_call_t *load);
    /* Where read `read` of the data section (at load->reads[read].at) lands. */
    void *(*buffer)(load_call_t *load, size_t read);
    /* Read `read` landed `length` bytes without a failure. */
    void (*landed)(load_call_t *load, size_t read, size_t length);
    /* Updates the reads' `copying`; answers whether some buffer is still in use. */
    bool (*pending)(load_call_t *load);
    /* No read is in flight but buffers are in use: come back to load_issue_reads later. */
    void (*idle)(load_call_t *load);
    /* A folder's weights are read, in load->model->data (the executor's host memory): place them, then
     * the load finishes. UFORM_OK, or a status with *message. NULL for a target that keeps them there. */
    uform_status_t (*placed)(load_call_t *load, char const **message);
    /* Before the call ends, success or not: prepares the towers when nothing failed (recording a
     * failure with load_stop) and frees what the target made. */
    void (*finish)(load_call_t *load);
} model_load_target_t;

struct load_call {
    call_t call;
    model_load_target_t const *target;
    char const *path;
    uform_progress_t progress;
    size_t next_step;
    bool map;
    uform_weights_t weights;
    int fd;
    loop_stat_t statx;
    loop_op_t step; /* open, statx, prefix and header reads, one at a time */
    uint8_t prefix[8];
    char *json;
    uint64_t header_length;
    uform_model_t *model;
    load_read_t reads[LOAD_READS];
    uint64_t issued, done;
    size_t in_flight;
    uform_status_t failure; /* once set, no read is issued and the call ends when in-flight ones drain */
    char const *message;
    alignas(max_align_t) unsigned char target_state[]; /* target->state_bytes, zeroed */
};

/* Opens and submits the load of args->path onto `target` (the arguments checked but args itself);
 * a blocking call waits and stores the model. Answers as uform_model_load_ram does. */
uform_status_t model_load(uform_model_load_args_t const *args, model_load_target_t const *target,
                          char const *entry);

/* Issues reads into free buffers while data is left and nothing failed; ends the call once nothing is
 * in flight or in use. */
void load_issue_reads(load_call_t *load);

/* Records the first failure; the call ends once nothing is in flight. */
void load_stop(load_call_t *load, uform_status_t status, char const *message);

/* Records the failure and ends the call now: nothing may be in flight. */
void load_fail(load_call_t *load, uform_status_t status, char const *message);
