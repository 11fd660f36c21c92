#!/usr/bin/env python3
"""The pixi packaging, checked offline with PyPI's py-rattler-build and py-rattler (no pixi, no channel).

1. pixi.toml and mojo/pixi.toml parse, and their workspace, platforms, channels, pins and tasks are the
   ones the project documents.
2. recipe/recipe.yaml (the engine) and mojo/recipe.yaml (the binding, `uform_mojo`) render for linux-64,
   linux-aarch64 and osx-arm64, and each platform gets the requirements it should (liburing and the
   io_uring loop on Linux only, a C compiler, the engine's run_exports, the binding's pins).
3. The engine is built the way its recipe builds it: the rendered script, run in a copy of the source
   tree with PREFIX set, by this machine's compiler against its libraries (the conda-forge host
   environment cannot be fetched offline); the recipe's package-content checks hold on what it installed.
4. The engine, the binding and the Mojo compiler are assembled into .conda packages and indexed into a
   local channel; the compiler's package is Modular's PyPI compiler (mojo==1.2.0 in the project's venv)
   linked in, standing for Modular's conda package, which cannot be fetched offline.
5. An environment is solved for `uform_mojo` from that channel alone and installed into a fresh prefix.
6. mojo/test.mojo is built with the prefix's compiler, configured as Modular's conda package configures
   it (package root, import path), with no -I and no linker flag, then run with no UFORM_* variable and no LD_LIBRARY_PATH,
   without and with UFORM_TEST_CHECKPOINT: the binding finds the engine in the prefix by itself.
7. examples/quickstart.mojo, the contract's Quickstart, is built the same way and run with no variable set in a
   folder holding its model.safetensors; it prints two rows of the model's width and a finite value.
   (The environment holds PATH and HOME alone: no UFORM_* variable, no LD_LIBRARY_PATH.)

Usage: check_packaging.py --source-root DIR --workdir DIR [--mojo PATH]. Exits 77 (skipped, naming what
to install) where py-rattler-build, py-rattler or the compiler is missing, and fails for it under CI=true.
"""
import argparse
import asyncio
import math
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "reference"))
from interpreter import how_to_install, unavailable  # noqa: E402  (standard library only)

PLATFORMS = ["linux-64", "linux-aarch64", "osx-arm64"]
VERSION = "4.0.0"
# What every platform's host environment holds, and what Linux adds.
HOST_EVERYWHERE = {"jansson", "libhwloc", "libjpeg-turbo", "ffmpeg", "libmicrohttpd", "openmpi"}
HOST_LINUX_ONLY = {"liburing"}


def check(condition, what):
    if not condition:
        raise SystemExit(f"check_packaging: FAILED: {what}")
    print(f"ok: {what}")


def names(specs):
    """The package names of a list of match specs ("meson >=1.0" -> "meson")."""
    return {str(spec).split()[0] for spec in specs}


def check_manifests(root):
    workspace = tomllib.loads((root / "pixi.toml").read_text())
    ws = workspace["workspace"]
    check(ws["platforms"] == PLATFORMS, f"pixi.toml: the platforms are {PLATFORMS}")
    check(ws["channels"] == ["https://conda.modular.com/max", "conda-forge"],
          "pixi.toml: Modular's channel, then conda-forge")
    check("pixi-build" in ws["preview"], "pixi.toml: the pixi-build preview")
    check(ws["version"] == VERSION and workspace["package"]["version"] == VERSION, f"pixi.toml: version {VERSION}")
    check(workspace["package"]["name"] == "uform", "pixi.toml: the package uform")
    check(workspace["package"]["build"]["backend"]["name"] == "pixi-build-rattler-build",
          "pixi.toml: built by the rattler-build backend (recipe/recipe.yaml)")
    check(workspace["system-requirements"]["libc"] == {"family": "glibc", "version": "2.34"},
          "pixi.toml: glibc 2.34 required")
    for platform, arch in (("linux-64", "64"), ("linux-aarch64", "aarch64")):
        deps = workspace["target"][platform]["dependencies"]
        check(deps.get(f"sysroot_linux-{arch}") == "2.34.*", f"pixi.toml: {platform} pins the glibc 2.34 sysroot")
        check("liburing" in deps, f"pixi.toml: {platform} has liburing")
    check("osx-arm64" not in workspace.get("target", {}), "pixi.toml: osx-arm64 has no sysroot and no liburing")
    check(workspace["dependencies"]["mojo"] == "1.2.*", "pixi.toml: mojo 1.2.*")
    tasks = workspace["tasks"]
    check({"build", "test", "demo"} <= set(tasks), "pixi.toml: the tasks build, test and demo")
    check("meson test" in tasks["test"]["cmd"] and "build" in tasks["test"]["depends-on"],
          "pixi.toml: test runs the meson suite (mojo/test.mojo among it) after build")
    check("uform encode" in tasks["demo"]["cmd"], "pixi.toml: demo embeds two texts")

    binding = tomllib.loads((root / "mojo" / "pixi.toml").read_text())
    check(binding["package"]["name"] == "uform_mojo" and binding["package"]["version"] == VERSION,
          "mojo/pixi.toml: the package uform_mojo, same version")
    check(binding["package"]["run-dependencies"]["uform"] == {"path": ".."},
          "mojo/pixi.toml: the engine as its run dependency, by path")


def render(recipe, platform):
    from rattler_build import PlatformConfig, RenderConfig, Stage0Recipe, VariantConfig
    variants = Stage0Recipe.from_file(str(recipe)).render(
        VariantConfig({}), RenderConfig(platform=PlatformConfig(target_platform=platform)))
    check(len(variants) == 1, f"{recipe.parent.name}/{recipe.name} renders one variant for {platform}")
    return variants[0].recipe.to_dict()


def check_recipes(root):
    rendered = {}
    for platform in PLATFORMS:
        engine = render(root / "recipe" / "recipe.yaml", platform)
        linux = platform.startswith("linux")
        host = names(engine["requirements"]["host"])
        want = HOST_EVERYWHERE | (HOST_LINUX_ONLY if linux else set())
        check(host == want, f"engine on {platform}: host {sorted(want)}")
        build = names(engine["requirements"]["build"])
        compiler = "gcc_" + platform if linux else "clang_" + platform
        check({compiler, "meson", "ninja", "pkg-config"} <= build, f"engine on {platform}: built by {compiler} and meson")
        pins = engine["requirements"]["run_exports"]["weak"]
        check([pin["pin_subpackage"]["name"] for pin in pins] == ["uform"], f"engine on {platform}: run_exports pins uform")
        script = engine["build"]["script"]
        check(script["env"]["URING"] == ("enabled" if linux else "disabled"),
              f"engine on {platform}: the io_uring backend {'on' if linux else 'off'}")
        binding = render(root / "mojo" / "recipe.yaml", platform)
        check(binding["build"].get("noarch") == "generic", f"binding on {platform}: noarch sources")
        check(sorted(binding["requirements"]["run"]) == sorted([f"uform =={VERSION}", "mojo-compiler 1.2.*"]),
              f"binding on {platform}: runs with uform =={VERSION} and mojo-compiler 1.2.*")
        rendered[platform] = (engine, binding)
    return rendered


def source_copy(root, into):
    """The tracked and unignored files of the checkout, as rattler-build's `source: path` copies them."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-co", "--exclude-standard", "-z"],
                            check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = root / name
        if source.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)


def run_script(script, cwd, prefix):
    """A rendered recipe script, line by line under bash -e, with rattler-build's PREFIX and SRC_DIR."""
    if not isinstance(script, dict):
        script = {"content": script}
    env = dict(os.environ, PREFIX=str(prefix), SRC_DIR=str(cwd), **script.get("env", {}))
    for line in script["content"]:
        print(f"+ {line}", flush=True)
        subprocess.run(["bash", "-ec", line], cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL)


def check_contents(recipe, prefix, where):
    for test in recipe.get("tests", []):
        contents = test.get("package_contents")
        if not contents:
            continue
        for name in contents.get("files", []):
            check((prefix / name).is_file(), f"{where}: installs {name}")
        for name in contents.get("include", []):
            check((prefix / "include" / name).is_file(), f"{where}: installs include/{name}")
        for name in contents.get("lib", []):
            check((prefix / "lib" / f"lib{name}.so").exists(), f"{where}: installs lib/lib{name}.so")
        for name in contents.get("bin", []):
            check(os.access(prefix / "bin" / name, os.X_OK), f"{where}: installs bin/{name}")


def build_engine(root, work, engine):
    source = work / "engine-source"
    stage = work / "engine-stage"
    source_copy(root, source)
    run_script(engine["build"]["script"], source, stage)
    check_contents(engine, stage, "engine")
    return stage


def stage_binding(root, work, binding):
    stage = work / "binding-stage"
    run_script(binding["build"]["script"], root / "mojo", stage)
    check_contents(binding, stage, "binding")
    return stage


def stage_compiler(work, mojo):
    """Modular's PyPI compiler linked into a conda layout: bin/mojo, its runtime libraries, the stdlib."""
    package_root = Path(mojo).resolve().parent.parent
    stage = work / "compiler-stage"
    (stage / "bin").mkdir(parents=True)
    (stage / "lib" / "mojo").mkdir(parents=True)
    (stage / "bin" / "mojo").symlink_to(package_root / "bin" / "mojo")
    for library in (package_root / "lib").glob("*.so"):
        (stage / "lib" / library.name).symlink_to(library)
    for package in (package_root / "lib" / "mojo").iterdir():
        (stage / "lib" / "mojo" / package.name).symlink_to(package)
    return stage


def modular_root(mojo):
    """The package root of the compiler the venv's `mojo` script starts (site-packages/modular)."""
    found = subprocess.run([mojo, "--version"], capture_output=True, text=True)
    check(found.returncode == 0 and "1.2." in found.stdout, f"the Mojo compiler is 1.2 ({found.stdout.strip()})")
    import importlib.util
    wheel = importlib.util.find_spec("mojo")  # the wheel's Python package, beside its compiler's tree
    check(wheel is not None, "the mojo wheel is importable, beside its compiler")
    return Path(list(wheel.submodule_search_locations)[0]).parent / "modular" / "bin" / "mojo"


def assemble(work, engine, binding, stages):
    from rattler_build import assemble_package
    channel = work / "channel"
    engine_stage, binding_stage, compiler_stage = stages
    # The engine's conda-forge run dependencies come from its host packages' run_exports in a real build;
    # offline there are none, and the prefix's libuform uses this machine's libraries.
    assemble_package("uform", VERSION, "linux-64", engine["build"]["string"], channel / "linux-64",
                     files_dir=str(engine_stage), compression_level=1, license="Apache-2.0")
    assemble_package("uform_mojo", VERSION, "noarch", binding["build"]["string"], channel / "noarch",
                     files_dir=str(binding_stage), depends=binding["requirements"]["run"], noarch="generic",
                     compression_level=1, license="Apache-2.0")
    assemble_package("mojo-compiler", "1.2.0", "linux-64", "pypi_0", channel / "linux-64",
                     files_dir=str(compiler_stage), compression_level=1)
    return channel


async def solve_and_install(channel, prefix):
    import rattler
    await rattler.index.index_fs(str(channel))
    records = await rattler.solve([channel.as_uri()], ["uform_mojo"], platforms=["linux-64", "noarch"],
                                  virtual_packages=[])
    solved = sorted(str(record.name.normalized) for record in records)
    check(solved == ["mojo-compiler", "uform", "uform_mojo"],
          f"uform_mojo solves from the local channel alone to {solved}")
    await rattler.install(records, target_prefix=str(prefix), show_progress=False)


def runpath(program):
    dynamic = subprocess.run(["readelf", "-d", str(program)], check=True, capture_output=True, text=True).stdout
    for line in dynamic.splitlines():
        if "(RUNPATH)" in line or "(RPATH)" in line:
            return line.split("[", 1)[1].rstrip("]").split(":")
    return []


def check_mojo_program(root, work, prefix):
    """mojo/test.mojo built with the prefix's compiler alone, run with nothing in its environment."""
    compiler_env = dict(os.environ, MODULAR_MAX_PACKAGE_ROOT=str(prefix), MODULAR_MOJO_MAX_PACKAGE_ROOT=str(prefix),
                        MODULAR_MOJO_MAX_DRIVER_PATH=str(prefix / "bin" / "mojo"),
                        MODULAR_MOJO_MAX_IMPORT_PATH=str(prefix / "lib" / "mojo"))
    for name in ("UFORM_LIBRARY", "LD_LIBRARY_PATH"):
        compiler_env.pop(name, None)
    program = work / "test_mojo"
    subprocess.run([str(prefix / "bin" / "mojo"), "build", str(root / "mojo" / "test.mojo"), "-o", str(program)],
                   cwd=work, env=compiler_env, check=True)
    check(str(prefix / "lib") in runpath(program), "the program's runpath is the prefix's lib, as mojo build bakes it")

    # No UFORM_* and no LD_LIBRARY_PATH: only what a login shell has (Open MPI's singleton start looks up
    # its daemon on PATH).
    plain = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    bare = subprocess.run([str(program)], cwd=work, env=plain, capture_output=True, text=True)
    print(bare.stdout + bare.stderr)
    check(bare.returncode == 0, "mojo/test.mojo passes with no variable naming the engine (found in the prefix)")
    check("model checks skipped" in bare.stdout, "without UFORM_TEST_CHECKPOINT the model checks say they skip")

    sys.path.insert(0, str(root / "mojo"))
    from run_test import write_media
    media = work / "media"
    media.mkdir()
    write_media(str(media))
    checkpoint = work / "tiny.safetensors"
    subprocess.run([str(prefix / "bin" / "uform"), "checkpoint", "tiny", str(checkpoint)], env=plain, check=True)
    full = subprocess.run([str(program)], cwd=work, capture_output=True, text=True,
                          env=dict(plain, UFORM_TEST_CHECKPOINT=str(checkpoint), UFORM_TEST_MEDIA=str(media)))
    print(full.stdout + full.stderr)
    check(full.returncode == 0, "mojo/test.mojo passes with UFORM_TEST_CHECKPOINT (the prefix's tiny checkpoint)")
    check("model checks skipped" not in full.stdout, "with UFORM_TEST_CHECKPOINT the model checks run")
    check_quickstart(root, work, prefix, compiler_env, plain, checkpoint)


def check_quickstart(root, work, prefix, compiler_env, plain, checkpoint):
    """examples/quickstart.mojo, the contract's Quickstart, built with the prefix's compiler and run with nothing
    in its environment, in a folder that holds its model.safetensors (the prefix's tiny checkpoint)."""
    folder = work / "quickstart"
    folder.mkdir()
    shutil.copyfile(checkpoint, folder / "model.safetensors")
    program = folder / "quickstart"
    subprocess.run([str(prefix / "bin" / "mojo"), "build", str(root / "examples" / "quickstart.mojo"), "-o",
                    str(program)], cwd=folder, env=compiler_env, check=True)
    run = subprocess.run([str(program)], cwd=folder, env=plain, capture_output=True, text=True)
    print(run.stdout + run.stderr)
    check(run.returncode == 0, "the Quickstart runs with no variable set")
    info = subprocess.run([str(prefix / "bin" / "uform"), "info", "--model", "model.safetensors"], cwd=folder,
                          env=plain, capture_output=True, text=True, check=True).stdout
    dims = next(line.split()[-1] for line in info.splitlines() if line.split()[:1] == ["dims"])
    words = run.stdout.split()
    check(len(words) == 3 and words[0] == "2" and words[1] == dims and math.isfinite(float(words[2])),
          f"the Quickstart prints 2 rows of the model's {dims} dims and a finite first value: {run.stdout!r}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--source-root", required=True, type=Path)
    parser.add_argument("--workdir", required=True, type=Path)
    parser.add_argument("--mojo", default=shutil.which("mojo") or "")
    args = parser.parse_args()
    try:
        import rattler  # noqa: F401
        import rattler_build  # noqa: F401
    except ImportError as error:
        unavailable(f"{error.name}: not importable ({how_to_install(['rattler_build', 'rattler'])})")
    if not args.mojo:
        unavailable(f"mojo: the mojo compiler is not found ({how_to_install(['mojo'])})")
    root = args.source_root.resolve()
    work = args.workdir.resolve()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)

    check_manifests(root)
    engine, binding = check_recipes(root)["linux-64"]
    stages = (build_engine(root, work, engine), stage_binding(root, work, binding),
              stage_compiler(work, modular_root(args.mojo)))
    channel = assemble(work, engine, binding, stages)
    prefix = work / "env"
    asyncio.run(solve_and_install(channel, prefix))
    check_mojo_program(root, work, prefix)
    print("check_packaging: every check passed")


if __name__ == "__main__":
    main()
