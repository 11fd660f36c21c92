#!/usr/bin/env python3
"""Builds mojo/test.mojo with the `mojo` compiler and runs it against a freshly built libuform, with
UFORM_TEST_CHECKPOINT pointing at a tiny checkpoint written by `uform_tiny_checkpoint`. Exits 77
(skipped, with the reason) where no compiler is at hand."""
import argparse
import os
import shutil
import subprocess
import sys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mojo", default="")
    parser.add_argument("--library", required=True)
    parser.add_argument("--tiny-checkpoint-tool", required=True)
    parser.add_argument("--source-root", required=True)
    parser.add_argument("--workdir", required=True)
    args = parser.parse_args()
    if not args.mojo or not shutil.which(args.mojo):
        print("mojo: skipped: the mojo compiler is not found (pip install mojo==1.2.0 into .venv)")
        return 77
    os.makedirs(args.workdir, exist_ok=True)
    checkpoint = os.path.join(args.workdir, "tiny.safetensors")
    subprocess.run([args.tiny_checkpoint_tool, checkpoint], check=True)
    program = os.path.join(args.workdir, "test_mojo")
    # `mojo build`, not `mojo run`: a linked program, as users ship it.
    subprocess.run([args.mojo, "build", "-I", os.path.join(args.source_root, "mojo"),
                    os.path.join(args.source_root, "mojo", "test.mojo"), "-o", program], check=True)
    env = dict(os.environ, UFORM_LIBRARY=os.path.abspath(args.library), UFORM_TEST_CHECKPOINT=checkpoint)
    return subprocess.run([program], env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
