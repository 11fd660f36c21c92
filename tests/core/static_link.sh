#!/bin/sh
# The engine linked statically (libuform.a) and dynamically (libuform.so) prints the same bytes: the one
# program, tests/core/static_link.c, built both ways, each run on its own copy of the tiny checkpoint.
#   static_link.sh STATIC_PROGRAM SHARED_PROGRAM WORKDIR
set -eu
static_program=$1
shared_program=$2
workdir=$3
rm -rf "$workdir"
mkdir -p "$workdir"
"$static_program" "$workdir/static.safetensors" > "$workdir/static.txt"
"$shared_program" "$workdir/shared.safetensors" > "$workdir/shared.txt"
if ! cmp -s "$workdir/static.txt" "$workdir/shared.txt"; then
    echo "the statically linked engine's embeddings differ from the shared library's:" >&2
    diff "$workdir/static.txt" "$workdir/shared.txt" >&2 || true
    exit 1
fi
echo "static and shared: the same $(wc -l < "$workdir/static.txt") rows, bit for bit"
