#!/bin/sh
# The object of the installed static libuform.a. Every engine object is compiled with hidden visibility,
# but a hidden symbol is still global to a static link: a program that links libuform.a would meet the
# engine's internal names (failed, call_begin, output_row, ...) beside its own. This links the engine's
# objects, the whole of ARCHIVE, into one relocatable object (the compiler driver's -r, without the C
# runtime), then makes every hidden symbol of that object local (objcopy --localize-hidden): its internal
# references are already bound inside the one object, and what stays global is what UFORM_EXPORT gives
# default visibility, the uform_* entry points. The engine's code and data are unchanged.
#
#   localize_static.sh OUTPUT ARCHIVE OBJCOPY CC [CC ARGUMENTS...]
#
# CC is the C compiler of the target machine, as meson runs it (a cross compiler in a cross build, with
# the OBJCOPY of the same binutils).
set -eu
if [ $# -lt 4 ]; then
    echo "usage: $0 OUTPUT ARCHIVE OBJCOPY CC [CC ARGUMENTS...]" >&2
    exit 2
fi
output=$1
archive=$2
objcopy=$3
shift 3
merged="$output.merged"
trap 'rm -f "$merged"' EXIT
"$@" -r -nostdlib -o "$merged" -Wl,--whole-archive "$archive" -Wl,--no-whole-archive
"$objcopy" --localize-hidden "$merged" "$output"
