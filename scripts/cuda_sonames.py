#!/usr/bin/env python3
"""The sonames of the CUDA runtime and cuBLASLt the build found, for the engine to dlopen them by, and the
folder of the toolkit's headers, the only part of it the engine compiles against.

    cuda_sonames.py NVCC
    cuda_sonames.py --nccl NVCC

Looks for the toolkit as meson's CUDA dependency does (CUDA_PATH, CUDA_HOME, CUDA_ROOT, then the toolkit
that holds NVCC, then /usr/local/cuda), in its library folders (lib64, lib, targets/*/lib), for the link
names libcudart.so and libcublasLt.so, reads the DT_SONAME of each from its ELF dynamic section, and prints
three lines: the runtime's soname, cuBLASLt's, and the folder holding cuda_runtime_api.h and cublasLt.h
beside those libraries (the toolkit's include, or the target's). Exits 1, saying why on stderr, when one
is missing. With --nccl it looks for libnccl.so in the same folders, then the system's (/usr/lib/<triplet>,
/usr/lib64, /usr/lib), and prints two lines: NCCL's soname and the folder holding nccl.h beside it (the
toolkit's include, or /usr/include); exit status 1 when there is none.
"""
import glob
import os
import struct
import sys

LIBRARIES = ["libcudart.so", "libcublasLt.so"]
SHT_DYNAMIC, DT_NULL, DT_SONAME = 6, 0, 14


def soname(path):
    """The DT_SONAME of a 64-bit little-endian ELF shared object, or None."""
    with open(path, "rb") as file:
        header = file.read(64)
        if header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            return None
        section_offset, = struct.unpack_from("<Q", header, 0x28)
        entry_size, count = struct.unpack_from("<HH", header, 0x3A)
        file.seek(section_offset)
        table = file.read(entry_size * count)
        sections = [struct.unpack_from("<IIQQQQII", table, i * entry_size) for i in range(count)]
        for _, kind, _, _, offset, size, link, _ in sections:
            if kind != SHT_DYNAMIC:
                continue
            file.seek(offset)
            dynamic = file.read(size)
            strings_offset, strings_size = sections[link][4], sections[link][5]
            file.seek(strings_offset)
            strings = file.read(strings_size)
            for at in range(0, len(dynamic) - 15, 16):
                tag, value = struct.unpack_from("<qQ", dynamic, at)
                if tag == DT_NULL:
                    break
                if tag == DT_SONAME:
                    return strings[value:strings.index(b"\0", value)].decode()
    return None


def library_folders(nvcc):
    """(library folder, header folders to try) of each place a toolkit may be."""
    roots = [os.environ[name] for name in ("CUDA_PATH", "CUDA_HOME", "CUDA_ROOT") if os.environ.get(name)]
    roots += [os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "/usr/local/cuda"]
    for root in roots:
        for folder in [os.path.join(root, "lib64"), os.path.join(root, "lib")]:
            yield folder, [os.path.join(root, "include")]
        for folder in sorted(glob.glob(os.path.join(root, "targets", "*", "lib"))):
            yield folder, [os.path.join(os.path.dirname(folder), "include"), os.path.join(root, "include")]


def nccl(nvcc):
    """NCCL's soname and header folder, or exits 1."""
    places = list(library_folders(nvcc))
    for folder in sorted(glob.glob("/usr/lib/*-linux-gnu")) + ["/usr/lib64", "/usr/lib"]:
        places.append((folder, ["/usr/include"]))
    for folder, includes in places:
        path = os.path.join(folder, "libnccl.so")
        if not os.path.exists(path):
            continue
        name = soname(path)
        headers = [include for include in includes if os.path.exists(os.path.join(include, "nccl.h"))]
        if name and headers:
            print("\n".join([name, headers[0]]))
            return
    sys.exit("cuda_sonames.py: no libnccl.so with nccl.h beside it")


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--nccl":
        nccl(sys.argv[2])
        return
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    for folder, includes in library_folders(sys.argv[1]):
        paths = [os.path.join(folder, name) for name in LIBRARIES]
        if not all(os.path.exists(path) for path in paths):
            continue
        names = [soname(path) for path in paths]
        if None in names:
            sys.exit(f"cuda_sonames.py: no soname in {paths[names.index(None)]}")
        headers = [include for include in includes
                   if all(os.path.exists(os.path.join(include, h)) for h in ("cuda_runtime_api.h", "cublasLt.h"))]
        if not headers:
            sys.exit(f"cuda_sonames.py: no headers of the CUDA toolkit beside {folder}")
        print("\n".join(names + headers[:1]))
        return
    sys.exit(f"cuda_sonames.py: no folder of the CUDA toolkit holds {' and '.join(LIBRARIES)}")


if __name__ == "__main__":
    main()
