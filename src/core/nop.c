/* The empty verb (uform_executor_nop): a whole call that computes nothing, after an optional delay on
 * the loop's timer; what a call costs, and a way to hold an executor for a while in tests. */
#include "call.h"

typedef struct nop {
    call_t call;
    loop_op_t timer;
    uint64_t delay_ns;
} nop_t;

_Static_assert(sizeof(nop_t) <= EXECUTOR_CALL_STORAGE, "the empty verb's state outgrew the call storage");

static void nop_timer_done(loop_op_t *op) {
    nop_t *nop = container_of(op, nop_t, timer);
    call_finish(&nop->call, UFORM_OK, NULL);
}

static void nop_start(call_t *call) {
    nop_t *nop = container_of(call, nop_t, call);
    if (nop->delay_ns == 0) {
        call_finish(call, UFORM_OK, NULL);
        return;
    }
    nop->timer.callback = nop_timer_done;
    loop_timer(call->executor->loop, &nop->timer, nop->delay_ns);
}

/* The call's state from its arguments, on the calling thread. */
static void nop_fill(call_t *call, void const *request) {
    container_of(call, nop_t, call)->delay_ns = ((uform_executor_nop_args_t const *)request)->delay_ns;
}

UFORM_EXPORT uform_status_t uform_executor_nop(uform_executor_nop_args_t const *args) {
    static char const entry[] = "uform_executor_nop";
    if (!args) return failed(UFORM_INVALID_ARGUMENT, entry, "args is NULL");
    call_plan_t plan = call_plan(entry, args->executor, NULL, args->outcome, sizeof(nop_t), nop_start);
    plan.fill = (call_fill_t){nop_fill, args};
    return call_run(&plan);
}
