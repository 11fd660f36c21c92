#!/bin/sh
# A 2-rank data-parallel run (mpirun) against one process on the concatenated batch, then a 3-rank run
# that the application splits into meshes of two and of one (options.communicator): mesh_train.c.
# Usage: mesh_train.sh MESH_TRAIN WORKDIR. Exit 77 (skip) without MPI in the build, or without mpirun
# (a failure under CI=true, where a missing dependency must not hide a check).
set -e
tool=$1
workdir=$2
mkdir -p "$workdir"
if ! command -v mpirun >/dev/null 2>&1; then
    case "${CI:-}" in
    true | 1 | yes) echo "FAIL: no mpirun on PATH: apt-get install openmpi-bin (under CI=true a missing dependency fails the check)"; exit 1 ;;
    *) echo "SKIP: no mpirun on PATH: apt-get install openmpi-bin"; exit 77 ;;
    esac
fi
set +e
"$tool" single "$workdir/single.safetensors"
status=$?
set -e
[ "$status" -eq 77 ] && exit 77
[ "$status" -eq 0 ] || exit "$status"
# Root in CI containers; oversubscribe: two ranks on however many cores. Open MPI leaks by design at
# finalize (its plugins are unloaded first, so LeakSanitizer cannot even name them): leaks are checked
# on the single-process run above, not on the ranks.
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun --oversubscribe --mca btl self,vader -n 2 "$tool" mesh "$workdir/mesh.safetensors"
"$tool" compare "$workdir/mesh.safetensors" "$workdir/single.safetensors"
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" \
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
    mpirun --oversubscribe --mca btl self,vader -n 3 "$tool" joined "$workdir/joined"
"$tool" compare "$workdir/joined-0.safetensors" "$workdir/single.safetensors"
"$tool" compare "$workdir/joined-1.safetensors" "$workdir/single.safetensors"
