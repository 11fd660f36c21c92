"""What the scripts driving the `uform` command share: running it with its exit status checked, their
own command line (--uform, --workdir, the folder emptied), and PNG images written with the standard
library. Standard library only."""
import argparse
import os
import resource
import shutil
import signal
import struct
import subprocess
import zlib


def run_bytes(uform, arguments, timeout, stdin=None, env=None, expect=0):
    """Runs `uform *arguments` and answers (stdout bytes, stderr text), checking its exit status."""
    done = subprocess.run([uform, *arguments], input=stdin, capture_output=True, env=env, timeout=timeout)
    stderr = done.stderr.decode("utf-8", "replace")
    if done.returncode != expect:
        command = " ".join(arguments)
        raise AssertionError(f"uform {command}: exit {done.returncode}, expected {expect}\n{stderr}")
    return done.stdout, stderr


def run_text(uform, arguments, timeout, expect=0):
    """run_bytes, stdout decoded too: (stdout text, stderr text)."""
    stdout, stderr = run_bytes(uform, arguments, timeout, expect=expect)
    return stdout.decode("utf-8", "replace"), stderr


def run_size_limited(uform, arguments, limit, timeout, stdin=None):
    """Runs `uform *arguments` under a file size limit of `limit` bytes, SIGXFSZ ignored, so that a write
    past it fails with EFBIG, as on a full disk: (exit status, stderr text).

    TMPDIR names a folder that does not exist: ThreadSanitizer's runtime, as it starts, writes a 512 KiB
    file there without checking the write and maps it, so under a smaller limit the process dies of
    SIGBUS before main; it skips that file when it cannot create it. The command itself reads no TMPDIR."""
    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = dict(os.environ, TMPDIR=os.path.join(os.sep, "nonexistent", "uform-size-limited"))
    done = subprocess.run([uform, *arguments], input=stdin, capture_output=True, preexec_fn=limited, env=env,
                          timeout=timeout)
    return done.returncode, done.stderr.decode("utf-8", "replace")


def parse_options(description):
    """--uform (the command) and --workdir (a folder made empty for this run)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--uform", required=True)
    parser.add_argument("--workdir", required=True)
    options = parser.parse_args()
    shutil.rmtree(options.workdir, ignore_errors=True)
    os.makedirs(options.workdir)
    return options


def write_png(path, width, height, shade):
    """An RGB8 PNG whose sample (x, y, c) is (7x + 3y + 50c + shade) mod 256."""
    rows = b"".join(b"\x00" + bytes((x * 7 + y * 3 + c * 50 + shade) % 256 for x in range(width) for c in range(3))
                    for y in range(height))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    with open(path, "wb") as file:
        file.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
                   + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
