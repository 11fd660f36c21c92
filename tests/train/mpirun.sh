#!/bin/sh
# Runs a test program under mpirun: mpirun.sh N PROGRAM [ARGS...] starts N processes of it, two or more on
# however many cores (--oversubscribe), over shared memory, as root where CI runs as root. Exit 77 (skip)
# without mpirun (a failure under CI=true, where a missing dependency must not hide a check). Open MPI
# leaks by design at finalize (its plugins are unloaded first, so LeakSanitizer cannot even name them):
# leaks are not checked in the ranks.
set -e
count=$1
shift
if ! command -v mpirun >/dev/null 2>&1; then
    case "${CI:-}" in
    true | 1 | yes) echo "FAIL: no mpirun on PATH: apt-get install openmpi-bin (under CI=true a missing dependency fails the check)"; exit 1 ;;
    *) echo "SKIP: no mpirun on PATH: apt-get install openmpi-bin"; exit 77 ;;
    esac
fi
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    exec mpirun --oversubscribe --mca btl self,vader -n "$count" "$@"
