#!/usr/bin/env python3
"""The macOS build, compiled and linked here against Apple's headers and libSystem's symbol list.

No Mac is reachable from the project's machines; PyPI's `ziglang` ships clang as `zig cc` with the
macOS SDK's libc headers (<sys/event.h>, <pthread.h>, <os/...>) and libSystem.tbd, the list of every
symbol that macOS's libSystem exports, so that a program can be compiled and linked for aarch64-macos
offline (it cannot be run). This check takes what the POSIX-only build it runs in compiles (its
compile_commands.json: the engine, libuform_internal, and the `uform` command), which is what a Mac
builds less two things, and gives each file the arguments meson gives a macOS host:

  - -DUFORM_LINUX=0 -DUFORM_POSIX_ONLY=0 -D_GNU_SOURCE for the POSIX-only build's -D_POSIX_C_SOURCE
    (-D_XOPEN_SOURCE in the command) and posix_guard/, so that src/core/futex.c compiles its os_sync branch and every file sees Darwin's
    headers in full, as on a Mac; uform_config.h with UFORM_WITH_KQUEUE 1;
  - the loop's kqueue poller (loop/kqueue.c) for poll(2)'s (loop/poll.c), and the NEON kernels
    (kernels/*_neon.c) beside the scalar ones, and the I8 dot product and matrix multiply paths under
    their own flags, as meson picks them for an AArch64 host (--swap, --add, --add-with).

Each file compiles for aarch64-macos with the build's own warnings and -Werror. The third-party headers
(jansson, hwloc, libjpeg-turbo, libspng, FFmpeg, Open MPI, libmicrohttpd, espeak-ng, utf8proc,
Oniguruma) are this
machine's, each library's own folder or file linked into a folder of their own, so that no other
header of Debian's (glibc's, Linux's) can stand in for one Darwin lacks. Then the objects link, as
libuform.dylib and the `uform` command, with undefined symbols as errors: each call must resolve in
libSystem.tbd, in the engine, or in a third-party library, whose exports are read from this machine's
build of it (nm -D) into a .tbd of its own. A call that only glibc has (pthread_barrier_*,
clock_nanosleep, sched_getaffinity, ...) fails the link, one that only Linux's headers declare fails
the compile.

The loop's core and its portable backend are compiled again for FreeBSD, NetBSD and OpenBSD (kqueue's
other systems), with their libc headers as zig ships them.

What this does not check: anything at run time on macOS (the kqueue poller runs on Linux through
libkqueue only, -Dkqueue=enabled), Apple's own clang and linker (zig's are LLVM's), the third-party
headers as Homebrew or conda-forge configure them for macOS, and os/os_sync_wait_on_address.h, which
zig's SDK lacks: the check declares those two functions as Apple's SDK does (macOS 14.4, the
signatures of Apple's documentation) in a header of its own, so the branch compiles and the two
symbols must resolve in libSystem.tbd, but the declarations are not Apple's file.

  macos_build.py --build-dir BUILD --work DIR [--swap OLD NEW]... [--add SOURCE]... [--add-with=SOURCE,FLAG,...]...

Exits 77 (skipped, naming the package) where ziglang is not installed; under CI=true that fails.
"""
import argparse
import json
import os
import re
import shlex
import shutil
import struct
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference"))
from interpreter import run_under_python_with  # noqa: E402  (standard library only)

# macOS 11, the first on Apple silicon, as the oldest system the build may run on: futex.c's os_sync
# branch (macOS 14.4) then stands beside its fallback, chosen at run time (__builtin_available), and
# both are compiled.
TARGET = "aarch64-macos.11.0"
# Undefined symbols that show each macOS branch compiled, by object.
EXPECTED_CALLS = {
    "futex.c.o": ["os_sync_wait_on_address", "os_sync_wake_by_address_all", "futex_table_wait",
                  "futex_table_wake_all"],
    "kqueue.c.o": ["kqueue", "kevent"],
    "doorbell.c.o": ["pipe"],
}
# Symbols no macOS object may name (libSystem has none of them; the link would fail too, less clearly).
FORBIDDEN_CALLS = {"eventfd", "syscall", "epoll_create1", "signalfd", "io_uring_queue_init", "statx", "ppoll"}
BSD_TARGETS = ["x86_64-freebsd", "x86_64-netbsd", "aarch64-openbsd"]
# What meson.build gives a host that is not Linux and not -Dplatform=posix.
MACOS_DEFINES = ["-D_GNU_SOURCE", "-DUFORM_LINUX=0", "-DUFORM_POSIX_ONLY=0"]
# What the POSIX-only build adds instead (the command's X/Open level too: tools/meson.build).
POSIX_ONLY_ARGUMENTS = {"-D_POSIX_C_SOURCE=200809L", "-D_XOPEN_SOURCE=700", "-DUFORM_LINUX=0",
                        "-DUFORM_POSIX_ONLY=1"}
# The targets of the POSIX-only build whose objects a Mac builds the same way: the engine and the command.
TARGETS = {"engine": "libuform_internal.a.p", "command": "tools/uform.p"}
# The third-party libraries: pkg-config name, the headers (files or folders) under its include folder,
# and the libraries it links.
THIRD_PARTY = [
    ("jansson", ["jansson.h", "jansson_config.h"], ["jansson"]),
    ("hwloc", ["hwloc.h", "hwloc"], ["hwloc"]),
    ("libturbojpeg", ["turbojpeg.h"], ["turbojpeg"]),
    ("spng", ["spng.h"], ["spng"]),
    ("libavformat", ["libavformat"], ["avformat"]),
    ("libavcodec", ["libavcodec"], ["avcodec"]),
    ("libavutil", ["libavutil"], ["avutil"]),
    ("libswresample", ["libswresample"], ["swresample"]),
    ("libswscale", ["libswscale"], ["swscale"]),
    ("libmicrohttpd", ["microhttpd.h"], ["microhttpd"]),
    ("espeak-ng", ["espeak-ng"], ["espeak-ng"]),
    ("libutf8proc", ["utf8proc.h"], ["utf8proc"]),
    ("oniguruma", ["oniguruma.h"], ["onig"]),
    ("ompi-c", ["mpi.h", "mpi_portable_platform.h", "mpi-ext.h", "openmpi"], ["mpi"]),
]
# os/os_sync_wait_on_address.h of Apple's SDK (macOS 14.4), which zig's copy of the SDK lacks: the two
# functions futex.c calls, with the signatures and flag types of Apple's documentation.
OS_SYNC_HEADER = """#pragma once
#include <Availability.h>
#include <stddef.h>
#include <stdint.h>
typedef uint32_t os_sync_wait_on_address_flags_t;
typedef uint32_t os_sync_wake_by_address_flags_t;
#define OS_SYNC_WAIT_ON_ADDRESS_NONE ((os_sync_wait_on_address_flags_t)0)
#define OS_SYNC_WAKE_BY_ADDRESS_NONE ((os_sync_wake_by_address_flags_t)0)
__API_AVAILABLE(macos(14.4))
int os_sync_wait_on_address(void *addr, uint64_t value, size_t size, os_sync_wait_on_address_flags_t flags);
__API_AVAILABLE(macos(14.4))
int os_sync_wake_by_address_all(void *addr, size_t size, os_sync_wake_by_address_flags_t flags);
"""


def fail(what):
    raise SystemExit(f"macos_build: FAILED: {what}")


def run(command, what, cwd=None):
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stdout.write(done.stdout + done.stderr)
        fail(f"{what}\n  {shlex.join(str(part) for part in command)}")
    return done.stdout


def zig_cc(target):
    return [sys.executable, "-m", "ziglang", "cc", "-target", target]


def pkg_config(name, *arguments):
    done = subprocess.run(["pkg-config", *arguments, name], capture_output=True, text=True)
    return done.stdout.split() if done.returncode == 0 else None


def tbd(install_name, symbols):
    """A text-based stub of a macOS library exporting `symbols` (C names, given Mach-O's underscore)."""
    listed = ", ".join(f"_{symbol}" for symbol in sorted(symbols))
    return (f"--- !tapi-tbd\ntbd-version: 4\ntargets: [ arm64-macos ]\ninstall-name: '{install_name}'\n"
            f"exports:\n  - targets: [ arm64-macos ]\n    symbols: [ {listed} ]\n...\n")


def exported(library):
    """The functions and data a shared library of this machine exports, without symbol versions."""
    lines = run(["nm", "-D", "--defined-only", library], f"nm -D {library}").splitlines()
    return {line.split()[2].split("@")[0] for line in lines if len(line.split()) == 3
            and line.split()[1] in "TDBRVWiu"}


def find_library(name, folders):
    for folder in folders:
        candidate = Path(folder) / f"lib{name}.so"
        if candidate.exists():
            return candidate.resolve()
    return None


def stage(source, destination):
    """Links `source` at `destination`; a folder is merged, file by file, with one of the same name
    staged before (hwloc's headers are split between /usr/include and its multiarch folder)."""
    if not source.is_dir():
        if not destination.exists():
            destination.symlink_to(source)
        return
    destination.mkdir(exist_ok=True)
    for child in source.iterdir():
        stage(child, destination / child.name)


def stage_third_party(work):
    """Links each third-party library's headers into work/include and writes a .tbd of each of its
    libraries into work/lib. Answers the -l names, and the libraries pkg-config does not know."""
    include, lib = work / "include", work / "lib"
    include.mkdir(parents=True)
    lib.mkdir(parents=True)
    multiarch = run(["gcc", "-print-multiarch"], "gcc -print-multiarch").strip()
    default_libs = [f"/usr/lib/{multiarch}", "/usr/lib"]
    linked, missing = [], []
    for package, headers, libraries in THIRD_PARTY:
        folder = pkg_config(package, "--variable=includedir")
        flags = pkg_config(package, "--cflags-only-I") or []
        if folder is None:
            missing.append(package)
            continue
        folders = [flag[2:] for flag in flags] + folder + [f"/usr/include/{multiarch}"]
        for header in headers:
            for found in (Path(f) / header for f in folders):
                if found.exists():
                    stage(found, include / header)
        library_folders = [flag[2:] for flag in pkg_config(package, "--libs-only-L") or []] + default_libs
        for name in libraries:
            found = find_library(name, library_folders)
            if found is None:
                fail(f"lib{name}.so of {package} not found in {library_folders}")
            (lib / f"lib{name}.tbd").write_text(tbd(f"@rpath/lib{name}.dylib", exported(found)))
            linked.append(name)
    (include / "os").mkdir()
    (include / "os" / "os_sync_wait_on_address.h").write_text(OS_SYNC_HEADER)
    return linked, missing


def macos_config(build, work):
    """The build's uform_config.h as a macOS host gets it: the loop's poller on kqueue."""
    folder = work / "config"
    folder.mkdir()
    text = (build / "uform_config.h").read_text()
    text, count = re.subn(r"#define UFORM_WITH_KQUEUE 0", "#define UFORM_WITH_KQUEUE 1", text)
    if count != 1:
        fail("uform_config.h has no UFORM_WITH_KQUEUE 0 to turn on")
    (folder / "uform_config.h").write_text(text)
    return folder


def macos_arguments(command, build, work, config):
    """A compile command of the POSIX-only build rewritten for macOS: the compiler, the defines, the
    include folders (Debian's dependency folders out, the staged headers in), no dependency files;
    answers the arguments without the source and the output."""
    words = shlex.split(command)[1:]
    kept, skip = [], False
    for word in words:
        if skip:
            skip = False
            continue
        if word in ("-MQ", "-MF", "-o"):
            skip = True
            continue
        if word in POSIX_ONLY_ARGUMENTS or word in ("-c", "-MD") or word.startswith("-fdiagnostics-color"):
            continue
        if word.startswith("-I") and (word.endswith("/posix_guard") or word.startswith("-I/usr/")):
            continue
        kept.append(word)
    return [f"-I{config}"] + kept[:-1] + MACOS_DEFINES + ["-isystem", str(work / "include")]


def compile_targets(build, work, config, swaps, additions):
    """Compiles every object of TARGETS for macOS; answers the objects by target."""
    entries = json.loads((build / "compile_commands.json").read_text())
    objects = {name: [] for name in TARGETS}
    engine_arguments = None
    for entry in entries:
        words = shlex.split(entry["command"])
        output = words[words.index("-o") + 1]
        target = next((name for name, folder in TARGETS.items() if output.startswith(folder + "/")), None)
        if target is None:
            continue
        source = swaps.get(os.path.normpath(build / entry["file"]), os.path.normpath(build / entry["file"]))
        arguments = macos_arguments(entry["command"], build, work, config)
        if target == "engine":
            engine_arguments = arguments
        objects[target].append(compile_one(source, arguments, build, work, target))
    if engine_arguments is None:
        fail(f"no object of {TARGETS['engine']} in compile_commands.json: is this the POSIX-only build?")
    for source, flags in additions:
        objects["engine"].append(compile_one(os.path.normpath(source), engine_arguments + zig_flags(flags), build, work,
                                             "engine", "-".join(flag.lstrip("-") for flag in flags)))
    return objects


def zig_flags(flags):
    """A source's own flags as zig cc takes them: it reads -march as a CPU's name, so the features an
    `-march=ARCH+feature...` adds go to clang as target features instead (the base architecture is
    the target's, Apple silicon's, already)."""
    kept = []
    for flag in flags:
        if flag.startswith("-march="):
            for feature in flag.split("+")[1:]:
                kept += ["-Xclang", "-target-feature", "-Xclang", "+" + feature]
        else:
            kept.append(flag)
    return kept


def compile_one(source, arguments, build, work, target, variant=""):
    """Compiles one source; a `variant` (of the same source under other flags) names its object apart."""
    folder = work / "objects" / target
    folder.mkdir(parents=True, exist_ok=True)
    output = folder / (Path(source).name + (f".{variant}" if variant else "") + ".o")
    if output.exists():
        fail(f"two sources named {Path(source).name} in {target}")
    run(zig_cc(TARGET) + arguments + ["-c", source, "-o", str(output)], f"{source} does not compile for macOS",
        cwd=build)
    return str(output)


def undefined_symbols(path):
    """The undefined external symbols of a 64-bit Mach-O object, without Mach-O's leading underscore."""
    data = Path(path).read_bytes()
    if struct.unpack_from("<I", data)[0] != 0xFEEDFACF:
        fail(f"{path} is not a 64-bit Mach-O object")
    commands = struct.unpack_from("<I", data, 16)[0]
    at = 32
    for _ in range(commands):
        command, size = struct.unpack_from("<II", data, at)
        if command == 0x2:  # LC_SYMTAB
            symbols, count, strings = struct.unpack_from("<III", data, at + 8)
            names = set()
            for index in range(count):
                name, kind = struct.unpack_from("<IB", data, symbols + 16 * index)
                if kind & 0x01 and kind & 0x0E == 0:  # N_EXT, N_UNDF
                    text = data[strings + name:data.index(b"\0", strings + name)].decode()
                    names.add(text[1:] if text.startswith("_") else text)
            return names
        at += size
    return set()


def check_calls(objects):
    """The macOS branches were compiled (each object calls what its branch calls), and no object calls
    what only Linux has."""
    by_name = {Path(path).name: path for path in objects["engine"]}
    for name, calls in EXPECTED_CALLS.items():
        if name not in by_name:
            fail(f"no engine object {name}")
        found = undefined_symbols(by_name[name])
        absent = [call for call in calls if call not in found]
        if absent:
            fail(f"{name} does not call {', '.join(absent)}: its macOS branch was not compiled")
        print(f"ok: {name} calls {', '.join(calls)}")
    for path in objects["engine"] + objects["command"]:
        named = undefined_symbols(path) & FORBIDDEN_CALLS
        if named:
            fail(f"{Path(path).name} calls {', '.join(sorted(named))}, which only Linux has")


def link(objects, work, linked):
    libraries = [f"-l{name}" for name in linked] + ["-lm", "-lpthread"]
    dylib = work / "libuform.4.dylib"
    run(zig_cc(TARGET) + ["-shared", "-o", str(dylib), "-Wl,-install_name,@rpath/libuform.4.dylib"]
        + objects["engine"] + [f"-L{work / 'lib'}"] + libraries, "libuform.dylib does not link for macOS")
    command = work / "uform"
    run(zig_cc(TARGET) + ["-o", str(command)] + objects["command"] + [str(dylib), f"-L{work / 'lib'}"]
        + libraries, "the uform command does not link for macOS")
    for made in (dylib, command):
        kind = run(["file", "-b", str(made)], f"file {made}")
        if "Mach-O 64-bit" not in kind or "arm64" not in kind:
            fail(f"{made.name} is not an arm64 Mach-O: {kind.strip()}")
        print(f"ok: {made.name}: {kind.strip()}")


def compile_bsd(build, work, config, swaps):
    """The loop (its core, the portable backend on kqueue, the doorbell) and the wait table for each BSD."""
    entries = json.loads((build / "compile_commands.json").read_text())
    sources = {}
    for entry in entries:
        path = swaps.get(os.path.normpath(build / entry["file"]), os.path.normpath(build / entry["file"]))
        if "/loop/" in path or path.endswith("/futex.c") or path.endswith("/futex_table.c"):
            sources.setdefault(path, entry["command"])
    for target in BSD_TARGETS:
        for source, command in sorted(sources.items()):
            arguments = macos_arguments(command, build, work, config)
            output = work / "objects" / target / (Path(source).name + ".o")
            output.parent.mkdir(parents=True, exist_ok=True)
            run(zig_cc(target) + arguments + ["-c", source, "-o", str(output)],
                f"{source} does not compile for {target}", cwd=build)
        print(f"ok: the loop and the wait table compile for {target}: "
              + " ".join(Path(source).name for source in sorted(sources)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build-dir", required=True, type=Path)
    parser.add_argument("--work", required=True, type=Path)
    parser.add_argument("--swap", nargs=2, action="append", default=[], metavar=("OLD", "NEW"))
    parser.add_argument("--add", action="append", default=[])
    parser.add_argument("--add-with", action="append", default=[], metavar="SOURCE,FLAG,...",
                        help="a source added with flags of its own")
    options = parser.parse_args()
    run_under_python_with(["ziglang"])
    build = options.build_dir.resolve()
    work = options.work.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    swaps = {os.path.normpath(Path(old).resolve()): os.path.normpath(Path(new).resolve())
             for old, new in options.swap}
    linked, missing = stage_third_party(work)
    if "jansson" not in linked:
        fail("pkg-config does not know jansson, which the engine needs (apt-get install libjansson-dev)")
    if missing:
        print(f"note: left out, pkg-config does not know them: {', '.join(missing)}")
    config = macos_config(build, work)
    additions = [(source, []) for source in options.add]
    additions += [(source, flags) for source, *flags in (value.split(",") for value in options.add_with)]
    objects = compile_targets(build, work, config, swaps, additions)
    print(f"ok: {len(objects['engine'])} engine and {len(objects['command'])} command sources compile for "
          f"{TARGET} with -Werror")
    check_calls(objects)
    link(objects, work, linked)
    compile_bsd(build, work, config, swaps)


if __name__ == "__main__":
    main()
