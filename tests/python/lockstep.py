#!/usr/bin/env python3
"""The Python extension (python/src/) in lock step with the C library's exports.

Every uform_* symbol the built library exports (nm -D) is either called by the extension's C code or
listed in UNBOUND below, never both, and neither names a symbol the library lacks: a function added to
include/uform.h fails this check until it is bound or listed. --self-test shows that the check fails
for a new export, for a listed symbol that is also called, and for a stale listing.

    lockstep.py --library build/libuform.so --source-root . [--self-test]
"""

import argparse
import re
import subprocess
import sys
from pathlib import Path

# Exported, not called by the extension: outcomes of deferred loads, tokenizations and choices (deferred
# encodes are bound, for asyncio; a choice is a blocking call) and io_uring notification; executors over a
# caller's thread pool or a fork_union pool (a pool of Python threads would run the engine's fork-join work
# under the GIL: a RAM executor does it better); the lesser accessors of executors, arenas and views (the
# binding owns its arenas and copies every view out); meshes and trainers.
UNBOUND = {
    "uform_outcome_notify_ring", "uform_outcome_model", "uform_outcome_probabilities", "uform_outcome_tokenized",
    "uform_ram_options_default", "uform_executor_create_pool", "uform_executor_create_fork_union",
    "uform_executor_nop",
    "uform_arena_reserve", "uform_arena_capacity", "uform_arena_generation",
    "uform_scalar_size", "uform_view_check", "uform_view_row",
    "uform_mesh_bootstrap", "uform_mesh_free", "uform_mesh_rank", "uform_mesh_size", "uform_mesh_info",
    "uform_trainer_config_default", "uform_trainer_init_ram", "uform_trainer_init_vram", "uform_trainer_free",
    "uform_trainer_step", "uform_trainer_save",
}


def exported(library: str) -> set:
    out = subprocess.run(["nm", "-D", "--defined-only", library], check=True, capture_output=True, text=True).stdout
    return {line.split()[-1] for line in out.splitlines() if line.split() and line.split()[-1].startswith("uform_")}


def called(source_root: Path) -> set:
    """The uform_* functions the extension's C code calls: a name followed by '(', outside comments and
    string literals."""
    names = set()
    for file in sorted((source_root / "python" / "src").glob("*.[ch]")):
        code = re.sub(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\])*"', " ", file.read_text(), flags=re.S)
        names |= set(re.findall(r"\b(uform_\w+)\s*\(", code))
    return names


def check(exports: set, calls: set, not_yet: set) -> list:
    errors = []
    for name in sorted(exports - calls - not_yet):
        errors.append(f"{name}: exported but neither called by python/src nor listed as unbound")
    for name in sorted(calls & not_yet):
        errors.append(f"{name}: called by python/src and also listed as unbound")
    for name in sorted(not_yet - exports):
        errors.append(f"{name}: listed as unbound but not exported by the library")
    for name in sorted(calls - exports):
        errors.append(f"{name}: called by python/src but not exported by the library")
    return errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--library", required=True)
    parser.add_argument("--source-root", required=True, type=Path)
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    exports, calls = exported(args.library), called(args.source_root)

    if args.self_test:
        assert not check(exports, calls, UNBOUND), "the real lists must pass first"
        assert check(exports | {"uform_new_verb"}, calls, UNBOUND), "a new export went unnoticed"
        assert check(exports, calls, UNBOUND | {"uform_text_encode"}), "called and listed went unnoticed"
        assert check(exports, calls, UNBOUND | {"uform_gone"}), "a stale listing went unnoticed"
        assert check(exports, calls - {"uform_text_encode"}, UNBOUND), "an export no longer called went unnoticed"
        print("python-lockstep self-test: the check catches what it must")
        return 0

    errors = check(exports, calls, UNBOUND)
    for error in errors:
        print("python-lockstep:", error)
    if errors:
        return 1
    print(f"python-lockstep: {len(calls)} symbols called by the extension, {len(UNBOUND)} listed as unbound")
    return 0


if __name__ == "__main__":
    sys.exit(main())
