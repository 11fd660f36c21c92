#!/usr/bin/env python3
"""The Mojo binding in lock-step with the C library.

1. Every exported uform_* symbol of the built library (nm -D) is either resolved in mojo/uform/library.mojo
   or listed in UNBOUND below, never both, and neither list names a symbol the library lacks; every
   resolved one is called by some Mojo code in mojo/uform (no symbol resolved and left unused).
2. Every C structure the binding mirrors has, in Mojo (mojo/layout.mojo, measured by the compiler), the
   size, alignment and field offsets the C compiler reports, and every enumeration value matches.
   Needs the `mojo` compiler; without it this half is skipped, with the reason (under CI=true it fails).
3. --self-test shows that both checks fail when a symbol is added without its binding, when a resolved
   symbol is called nowhere, and when a C structure grows a field.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "reference"))
from interpreter import how_to_install, partly_unavailable  # noqa: E402  (standard library only)

# Exported, not bound yet: each is a verb or accessor the Mojo package does not offer today
# (uform_ram_options_default, once thought to crash when returning its structure by value, is bound and called
# by value; mojo/NOTES.md). A model's own tokenizer (borrowed for the model's lifetime) is not in the binding:
# Tokenizer.open of the model's folder cuts alike.
UNBOUND = {"uform_model_tokenizer"}


def exported(library):
    out = subprocess.run(["nm", "-D", "--defined-only", library], check=True, capture_output=True, text=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.split() and line.split()[-1].startswith("uform_")}


def bound(source_root):
    text = open(os.path.join(source_root, "mojo", "uform", "library.mojo")).read()
    return set(re.findall(r'_resolve\[\w+\]\(handle, "(uform_\w+)"\)', text))


def called(source_root):
    """Entry points some Mojo code calls through the symbol table (`_symbols[].name(` or `symbols[].name(`)."""
    names = set()
    folder = os.path.join(source_root, "mojo", "uform")
    for file in os.listdir(folder):
        if file.endswith(".mojo"):
            names |= {"uform_" + n for n in re.findall(r'symbols\[\]\.(\w+)\(', open(os.path.join(folder, file)).read())}
    return names


def check_symbols(exports, bindings, not_yet, calls=None):
    errors = []
    for name in sorted(bindings - (bindings if calls is None else calls)):
        errors.append(f"{name}: resolved in mojo/ but no Mojo verb calls it")
    for name in sorted(exports - bindings - not_yet):
        errors.append(f"{name}: exported but neither bound in mojo/ nor listed as unbound")
    for name in sorted(bindings & not_yet):
        errors.append(f"{name}: bound and also listed as unbound")
    for name in sorted((bindings | not_yet) - exports):
        errors.append(f"{name}: named by the binding but not exported by the library")
    return errors


def c_program(lines, header_dir):
    """A C program printing, for each line Mojo printed, the same quantity as C sees it."""
    body = []
    for kind, *rest in lines:
        if kind == "size":
            body.append(f'printf("size {rest[0]} %zu %zu\\n", sizeof({rest[0]}), _Alignof({rest[0]}));')
        elif kind == "offset":
            body.append(f'printf("offset {rest[0]} {rest[1]} %zu\\n", offsetof({rest[0]}, {rest[1]}));')
        elif kind == "enum":
            body.append(f'printf("enum {rest[0]} %lld\\n", (long long){rest[0]});')
    return ("#include <stddef.h>\n#include <stdio.h>\n#include <uform.h>\nint main(void) {\n    "
            + "\n    ".join(body) + "\n    return 0;\n}\n")


def check_layout(mojo_lines, c_lines):
    errors = []
    c_by_key = {tuple(line[:-2] if line[0] == "size" else line[:-1]): line for line in c_lines}
    for line in mojo_lines:
        key = tuple(line[:-2] if line[0] == "size" else line[:-1])
        c = c_by_key.get(key)
        if c != line:
            errors.append(f"Mojo says {' '.join(line)}; C says {' '.join(c) if c else 'nothing'}")
    return errors


def measure(args):
    """(mojo_lines, c_lines), or None with a reason when no compiler is at hand."""
    if not args.mojo or not shutil.which(args.mojo):
        reason = f"the mojo compiler is not found ({how_to_install(['mojo'])})"
        partly_unavailable(f"mojo-lockstep: {reason}: the layout half is left out")
        return None, reason
    os.makedirs(args.workdir, exist_ok=True)
    layout = os.path.join(args.workdir, "layout")
    subprocess.run([args.mojo, "build", "-I", os.path.join(args.source_root, "mojo"),
                    os.path.join(args.source_root, "mojo", "layout.mojo"), "-o", layout], check=True)
    mojo_lines = [l.split() for l in subprocess.run([layout], check=True, capture_output=True, text=True).stdout.splitlines()]
    source = os.path.join(args.workdir, "layout.c")
    open(source, "w").write(c_program(mojo_lines, None))
    program = os.path.join(args.workdir, "layout_c")
    subprocess.run([args.cc, "-std=c11", "-I", os.path.join(args.source_root, "include"), source, "-o", program], check=True)
    c_lines = [l.split() for l in subprocess.run([program], check=True, capture_output=True, text=True).stdout.splitlines()]
    return (mojo_lines, c_lines), None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--library", required=True)
    parser.add_argument("--source-root", required=True)
    parser.add_argument("--cc", default="cc")
    parser.add_argument("--mojo", default="")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()

    exports, bindings, calls = exported(args.library), bound(args.source_root), called(args.source_root)
    measured, reason = measure(args)

    if args.self_test:
        # A symbol added to the library without a binding must fail, as must a structure that grew.
        assert not check_symbols(exports, bindings, UNBOUND, calls), "the real lists must pass first"
        assert check_symbols(exports | {"uform_new_verb"}, bindings, UNBOUND, calls), "a new symbol went unnoticed"
        assert check_symbols(exports, bindings, UNBOUND, calls - {"uform_view_copy"}), "an uncalled symbol went unnoticed"
        assert check_symbols(exports, bindings, UNBOUND | {"uform_view_copy"}, calls), "bound and listed went unnoticed"
        assert check_symbols(exports, bindings, UNBOUND | {"uform_gone"}, calls), "a stale listing went unnoticed"
        if measured:
            mojo_lines, c_lines = measured
            grown = [line[:-2] + [str(int(line[-2]) + 8), line[-1]] if line[:2] == ["size", "uform_view_t"] else line
                     for line in c_lines]
            assert check_layout(mojo_lines, grown), "a grown structure went unnoticed"
            moved = [line[:-1] + ["99"] if line[:3] == ["offset", "uform_tape_t", "count"] else line for line in c_lines]
            assert check_layout(mojo_lines, moved), "a moved field went unnoticed"
        print("mojo-lockstep self-test: both checks catch what they must" + ("" if measured else f" (layout part skipped: {reason})"))
        return 0

    errors = check_symbols(exports, bindings, UNBOUND, calls)
    if measured:
        errors += check_layout(*measured)
    for error in errors:
        print("mojo-lockstep:", error)
    if errors:
        return 1
    print(f"mojo-lockstep: {len(bindings)} symbols bound, {len(UNBOUND)} listed as unbound"
          + (f", {len(measured[0])} layout and enumeration facts agree" if measured else f"; layout skipped: {reason}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
