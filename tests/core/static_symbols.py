#!/usr/bin/env python3
"""The static libuform.a defines, globally, exactly the entry points include/uform.h declares.

A program that links an archive statically meets every global symbol the archive defines beside its own,
whatever the symbol's visibility: an internal name left global (failed, call_begin, ...) collides with a
program's function of that name. The installed archive holds one object whose hidden symbols are local
(scripts/localize_static.sh). This reads `nm` of the archive and reports, one line each:

  - a global definition whose name is outside the public prefix and not in EXCEPTIONS below;
  - a global uform_* definition that include/uform.h does not declare with UFORM_EXPORT;
  - a UFORM_EXPORT function of include/uform.h that the archive does not define globally.

It exits 1 when it reports anything. With --expect-faults NAME... it checks itself instead: run on an
archive of the engine's objects as compiled (libuform_internal.a), it must report each NAME as a global
definition outside the prefix, and exits 0 only then.

  static_symbols.py --nm NM --archive libuform.a --header include/uform.h [--expect-faults NAME...]
"""
import argparse
import re
import subprocess
import sys

PREFIX = "uform_"

# Global definitions allowed outside PREFIX, each with the reason it must stay global. None today: the
# header has no inline functions or macros that reach an internal symbol.
EXCEPTIONS = {}


def archive_globals(nm, archive):
    """{name: (member, type)} of every global symbol the archive defines (nm -P: name, type, value, size)."""
    lines = subprocess.run([nm, "-P", "-A", "-g", "--defined-only", archive], check=True,
                           capture_output=True, text=True).stdout.splitlines()
    found = {}
    for line in lines:
        match = re.match(r"^(.*?\[(.*?)\]|[^:]*): (\S+) (\S)", line)
        if not match:
            raise SystemExit(f"static_symbols: cannot read this line of {nm}: {line!r}")
        found[match.group(3)] = (match.group(2) or match.group(1), match.group(4))
    return found


def header_exports(header):
    """The names of the functions and data include/uform.h declares with UFORM_EXPORT."""
    text = open(header, encoding="utf-8").read()
    names = set()
    for line in re.findall(r"^UFORM_EXPORT\b(.*)$", text, re.M):
        match = re.search(r"\b(" + PREFIX + r"\w+)\s*(\(|;|\[)", line)
        if not match:
            raise SystemExit(f"static_symbols: cannot read the name of this declaration of {header}: {line!r}")
        names.add(match.group(1))
    if not names:
        raise SystemExit(f"static_symbols: {header} declares nothing with UFORM_EXPORT")
    return names


def faults(found, exports, archive, header):
    """The fault lines, and the set of internal names found global."""
    lines, internal = [], set()
    for name, (member, kind) in sorted(found.items()):
        if name.startswith(PREFIX):
            if name not in exports:
                lines.append(f"{archive}: {member} exports {name} ({kind}), which {header} does not declare UFORM_EXPORT")
        elif name not in EXCEPTIONS:
            internal.add(name)
            lines.append(f"{archive}: {member} defines {name} ({kind}) globally: a program's own {name} would collide")
    for name in sorted(exports - found.keys()):
        lines.append(f"{archive}: no global definition of {name}, which {header} declares UFORM_EXPORT")
    for name in sorted(EXCEPTIONS.keys() - found.keys()):
        lines.append(f"static_symbols.py: the exception {name} is no longer defined by {archive}: remove it")
    return lines, internal


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nm", default="nm")
    parser.add_argument("--archive", required=True)
    parser.add_argument("--header", required=True)
    parser.add_argument("--expect-faults", nargs="+", metavar="NAME")
    args = parser.parse_args()
    found = archive_globals(args.nm, args.archive)
    lines, internal = faults(found, header_exports(args.header), args.archive, args.header)
    if args.expect_faults:
        missed = [name for name in args.expect_faults if name not in internal]
        if missed:
            print(f"static_symbols: the check did not report {', '.join(missed)} as global in {args.archive}")
            return 1
        print(f"static_symbols: the check reports {len(internal)} internal global definitions of {args.archive}, "
              f"{', '.join(args.expect_faults)} among them")
        return 0
    for line in lines:
        print(line)
    if lines:
        print(f"static_symbols: {len(lines)} faults")
        return 1
    print(f"static_symbols: {args.archive} defines globally the {len(found)} entry points of {args.header} "
          f"and nothing else")
    return 0


if __name__ == "__main__":
    sys.exit(main())
