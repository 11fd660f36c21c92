#!/usr/bin/env python3
"""run_under_python_with (interpreter.py) finds the project's venv and the folders a script adds to its path.

    test_interpreter.py            run by any python3: checks, in a child under Debian's /usr/bin/python3

Regression checks, each named for its bug:
  - interpreter_probe_skipped_venv_of_same_binary: under /usr/bin/python3, the venv's python3 (a link to
    that same file) was taken for the running interpreter and never tried, so a check that needs a module
    only the venv has skipped instead of running there;
  - interpreter_probe_ignored_added_paths: a module that the script itself puts on sys.path (PyPI's uform,
    installed apart) was probed without that folder, so no candidate could import it.
Skipped (77) where /usr/bin/python3 or the project's venv is missing, or the venv lacks safetensors.
"""

import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from interpreter import CANDIDATES, SKIP, run_under_python_with  # noqa: E402

CHILD_FLAG = "--child"


def child(extra: str) -> int:
    """Needs safetensors (in the venv, not in Debian's Python) and a module of `extra` (on no path but the
    one this script adds): answers the interpreter it ends up in."""
    sys.path.insert(0, extra)
    run_under_python_with(["safetensors", "probe_only_here"], paths=(extra,))
    print("prefix", sys.prefix)
    return 0


def main() -> int:
    venv, system = CANDIDATES
    if not venv.exists() or not Path("/usr/bin/python3").exists():
        print("SKIP: needs /usr/bin/python3 and the project's .venv")
        return SKIP
    if subprocess.run([str(venv), "-c", "import safetensors"], capture_output=True).returncode:
        print("SKIP: the venv lacks safetensors")
        return SKIP
    with tempfile.TemporaryDirectory() as extra:
        (Path(extra) / "probe_only_here.py").write_text("")
        environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "UFORM_REFERENCE_REEXEC")}
        run = subprocess.run([str(system), __file__, CHILD_FLAG, extra], capture_output=True, text=True,
                             env=environment)
    print(run.stdout, run.stderr, sep="", end="")
    expected = f"prefix {venv.parent.parent}"
    if run.returncode != 0 or expected not in run.stdout:
        print(f"FAILED: the child under {system} should have run again under {venv} "
              f"(interpreter_probe_skipped_venv_of_same_binary, interpreter_probe_ignored_added_paths)")
        return 1
    print("OK: re-run under the venv, with the script's own folder on its path")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == CHILD_FLAG:
        sys.exit(child(sys.argv[2]))
    sys.exit(main())
