"""Finds a Python that can import what a test or benchmark needs, before it imports any of it.

Meson may find a python3 without PyTorch (pyenv, a venv without system packages): a script calls
`run_under_python_with(["torch", "numpy"])` first, which returns at once where they import, re-runs
the script under the project's .venv or Debian's /usr/bin/python3 where one of them has them, and
otherwise says so and exits (77, meson's skip, for a test; 0 for a benchmark). Standard library only.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

SKIP = 77
REPOSITORY = Path(__file__).resolve().parents[2]
CANDIDATES = (REPOSITORY / ".venv" / "bin" / "python3", Path("/usr/bin/python3"))


def run_under_python_with(modules: list, status: int = SKIP, flag: str = "UFORM_REFERENCE_REEXEC",
                          hint: str = "") -> None:
    """Returns when this interpreter imports every one of `modules`; else re-runs this script under a
    candidate that does (`flag` set in its environment, so that it happens once), or prints what is
    missing (and `hint`) and exits with `status`."""
    try:
        for module in modules:
            importlib.import_module(module)
        return
    except ImportError:
        pass
    names = ", ".join(modules)
    if not os.environ.get(flag):
        here = os.path.realpath(sys.executable)
        for candidate in CANDIDATES:
            if not candidate.exists() or os.path.realpath(candidate) == here:
                continue
            if subprocess.run([str(candidate), "-c", f"import {names}"], capture_output=True).returncode == 0:
                print(f"note: {sys.executable} cannot import {names}; running under {candidate}", flush=True)
                os.execve(str(candidate), [str(candidate), *sys.argv], {**os.environ, flag: "1"})
    places = ", ".join(str(c) for c in (sys.executable, *CANDIDATES))
    print(f"{'SKIP: ' if status == SKIP else ''}{names} cannot be imported by {places}{hint}")
    sys.exit(status)
