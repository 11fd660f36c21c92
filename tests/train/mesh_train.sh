#!/bin/sh
# A 2-rank data-parallel run (mpirun) against one process on the concatenated batch, then a 3-rank run
# that the application splits into meshes of two and of one (options.communicator): mesh_train.c.
# Usage: mesh_train.sh MESH_TRAIN WORKDIR. Exit 77 (skip) without MPI in the build, or without mpirun
# (mpirun.sh: a failure under CI=true).
set -e
tool=$1
workdir=$2
here=$(dirname "$0")
mkdir -p "$workdir"
set +e
"$tool" single "$workdir/single.safetensors"
status=$?
set -e
[ "$status" -eq 77 ] && exit 77
[ "$status" -eq 0 ] || exit "$status"
# Leaks are checked on the single-process run above, not on the ranks (mpirun.sh).
"$here/mpirun.sh" 2 "$tool" mesh "$workdir/mesh.safetensors"
"$tool" compare "$workdir/mesh.safetensors" "$workdir/single.safetensors"
"$here/mpirun.sh" 3 "$tool" joined "$workdir/joined"
"$tool" compare "$workdir/joined-0.safetensors" "$workdir/single.safetensors"
"$tool" compare "$workdir/joined-1.safetensors" "$workdir/single.safetensors"
