#!/usr/bin/env python3
"""What `pip install .` installs, read from the build's install plan without building a wheel.

meson-python installs what meson's install plan tags `python-runtime` (pyproject.toml), and refuses a
package split between purelib and platlib. This checks, on the plan of the build folder given, that the
tag covers exactly the package (python/uform/'s files and the extension) and puts all of it in one
folder, `{py_platlib}/uform`; and that pyproject.toml names meson-python, takes its version from meson
and installs by that tag.

    install_plan.py --build-root build --source-root .
"""

import argparse
import json
import re
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-root", required=True, type=Path)
    parser.add_argument("--source-root", required=True, type=Path)
    args = parser.parse_args()
    errors = []
    plan = json.loads((args.build_root / "meson-info" / "intro-install_plan.json").read_text())
    tagged = {entry["destination"] for kind in plan.values() for entry in kind.values()
              if entry.get("tag") == "python-runtime"}
    package = {path.name for path in (args.source_root / "python" / "uform").iterdir()
               if path.is_file() and path.name != "meson.build"}
    wanted = {f"{{py_platlib}}/uform/{name}" for name in package}
    extension = {destination for destination in tagged - wanted
                 if re.fullmatch(r"\{py_platlib\}/uform/_uform\.[^/]+\.(so|pyd)", destination)}
    if len(extension) != 1:
        errors.append(f"the extension uform/_uform.* is not installed once under the python-runtime tag: {sorted(tagged)}")
    for destination in sorted(wanted - tagged):
        errors.append(f"{destination}: not installed under the python-runtime tag")
    for destination in sorted(tagged - wanted - extension):
        errors.append(f"{destination}: installed under the python-runtime tag, outside the package")
    pyproject = (args.source_root / "pyproject.toml").read_text()
    for needed in ('build-backend = "mesonpy"', 'dynamic = ["version"]', 'install = ["--tags=python-runtime"]'):
        if needed not in pyproject:
            errors.append(f"pyproject.toml: no {needed}")
    for error in errors:
        print("python-packaging:", error)
    if errors:
        return 1
    print(f"python-packaging: {len(tagged)} files under the python-runtime tag, all in {{py_platlib}}/uform")
    return 0


if __name__ == "__main__":
    sys.exit(main())
