/* The amx path's enabling (kernels/dispatch.c) when Linux refuses the tiles: in a child process whose seccomp
 * filter answers EPERM to arch_prctl(ARCH_REQ_XCOMP_PERM), kernels_active falls back to another path and
 * kernels_amx_state names the refusal and its errno. On a CPU (or an OS) without AMX the request is never
 * made: the child then reports the reason the parent's unfiltered child gives, "not on this CPU" or "not
 * enabled by the OS", and the test says that this is what it checked. x86-64 Linux only. */
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "kernels.h"

enum { ARCH_REQ_XCOMP_PERM_OPTION = 0x1023, XFEATURE_XTILEDATA_BIT = 18 };

/* What a child saw: the errno of its own arch_prctl request (0: granted), the path kernels_active chose
 * and kernels_amx_state; `unfiltered` when seccomp could not be installed. */
typedef struct child_report {
    int request_errno;
    bool unfiltered; /* seccomp unavailable: nothing was filtered */
    char path[32];
    char state[160];
} child_report_t;

/* Makes this process's arch_prctl(ARCH_REQ_XCOMP_PERM, ...) fail with EPERM, every other call allowed. */
static bool refuse_tile_permission(void) {
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_arch_prctl, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])), /* low half */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, ARCH_REQ_XCOMP_PERM_OPTION, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog program = {.len = sizeof filter / sizeof filter[0], .filter = filter};
    return prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
           prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) == 0;
}

/* The child's side: its report into `to`, then _exit. */
static void child_run(int to, bool filtered) {
    child_report_t report = {0};
    if (filtered && !refuse_tile_permission()) report.unfiltered = true;
    if (filtered && !report.unfiltered)
        report.request_errno =
            syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM_OPTION, XFEATURE_XTILEDATA_BIT) == 0 ? 0 : errno;
    snprintf(report.path, sizeof report.path, "%s", kernels_active()->name);
    snprintf(report.state, sizeof report.state, "%s", kernels_amx_state());
    _exit(write(to, &report, sizeof report) == (ssize_t)sizeof report ? 0 : 1);
}

/* A child's report, with or without the filter: the kernels are chosen in the child alone. */
static child_report_t child_report(bool filtered) {
    int pipe_ends[2];
    assert_int_equal(pipe(pipe_ends), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(pipe_ends[0]);
        child_run(pipe_ends[1], filtered);
    }
    close(pipe_ends[1]);
    child_report_t report;
    assert_int_equal(read(pipe_ends[0], &report, sizeof report), sizeof report);
    close(pipe_ends[0]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    return report;
}

static void test_refused_permission_falls_back(void **state) {
    (void)state;
    child_report_t plain = child_report(false), refused = child_report(true);
    if (refused.unfiltered) {
        print_message("[  SKIP    ] seccomp filters are not available to this process\n");
        skip();
    }
    print_message("unfiltered: path %s, %s\nfiltered: path %s, %s\n", plain.path, plain.state, refused.path,
                  refused.state);
    assert_int_equal(refused.request_errno, EPERM); /* the filter works, AMX or not */
    assert_string_not_equal(refused.path, "amx");
    if (!strcmp(plain.state, "amx: enabled")) {
        assert_non_null(strstr(refused.state, "amx: refused by the kernel (errno 1:"));
        return;
    }
    print_message("this CPU or OS has no AMX: checked that its reason is reported, not a refusal\n");
    assert_string_equal(refused.state, plain.state);
    assert_true(!strncmp(plain.state, "amx: not on this CPU", 20) ||
                !strncmp(plain.state, "amx: not enabled", 16) || !strncmp(plain.state, "amx: not run", 12));
}

int main(void) {
    struct CMUnitTest const tests[] = {
        cmocka_unit_test(test_refused_permission_falls_back),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
