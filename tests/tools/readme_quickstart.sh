#!/bin/sh
# The README's C quick start must be examples/quickstart.c, and must compile and run as written.
set -eu
source_root=$1
build_root=$2
compiler=$3
sanitize=${4:-none}
flags=""
[ "$sanitize" = none ] || flags="-fsanitize=$sanitize"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
awk '/^```c$/ { inside = 1; next } /^```$/ { if (inside) exit } inside { print }' "$source_root/README.md" > "$work/quickstart.c"
if ! cmp -s "$work/quickstart.c" "$source_root/examples/quickstart.c"; then
    echo "README.md's C block differs from examples/quickstart.c:" >&2
    diff "$work/quickstart.c" "$source_root/examples/quickstart.c" >&2 || true
    exit 1
fi
"$compiler" -std=c11 -Wall -Wextra -Werror $flags -I"$source_root/include" "$work/quickstart.c" \
    -L"$build_root" -Wl,-rpath,"$build_root" -luform -o "$work/quickstart"
cd "$work"
./quickstart
