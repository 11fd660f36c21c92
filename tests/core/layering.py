#!/usr/bin/env python3
"""The engine's layers: who may include and call whom, and the cycles between files.

Two graphs over the engine's files under src/:

  - the #include graph, from the sources: every `#include "x.h"` or `<x.h>` outside comments, resolved
    as the compiler resolves it (the including file's folder for quoted names, then INCLUDE_DIRS, the
    folders meson gives the engine); a name found in none of them is a system header and ignored. An
    include under #if counts: it is a dependency of the file whatever the build;
  - the call graph, from `nm` of the engine's archive in the build folder (libuform_internal.a): an
    object's undefined symbol that another of the archive's objects defines is an edge from the one
    source file to the other, "calls" for a function, "uses" for data. What macros and inline
    functions expand to is counted where it is compiled. Only what this build compiles is seen (the
    VRAM files need CUDA).

It reports, one fault per line with the files named:

  - include cycles and call cycles: each strongly connected set of two or more files, with every edge
    inside it, when it holds a file under src/ (cycles within loop/ or kernels/, such as the loop's core
    and its backends, are theirs);
  - a file under src/ that includes or calls a file of a layer its row of RULES does not name;
  - a file of a layer in NAMES_NO_TYPES that names one of the types listed there, outside comments
    and strings.

It exits 1 when it reports anything. --self-test checks the check instead: on a small tree it writes
and compiles with CC (an include cycle, a call cycle, a call and an include across layers, a model type
named in core, and the same name in a comment and a string), it must report exactly the faults planted.

  layering.py --source-root ROOT --build-dir BUILD [--nm NM]
  layering.py --self-test --cc CC [--nm NM]
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

# Layers, by folder (the longest matching prefix wins); `public` is the header the engine implements,
# `config` the header meson writes.
LAYERS = {
    "src/core": "core",
    "src/model": "model",
    "src/media": "media",
    "src/encode": "encode",
    "src/vram": "vram",
    "src/train": "train",
    "src/tokenizer": "tokenizer",
    "loop": "loop",
    "kernels": "kernels",
    "include": "public",
    "@build": "config",
}

# What each layer of src/ may include and call, besides itself.
RULES = {
    "core": ["loop", "kernels", "public", "config"],
    "tokenizer": ["core", "loop", "public", "config"],
    "model": ["tokenizer", "core", "loop", "kernels", "public", "config"],
    "media": ["core", "loop", "kernels", "public", "config"],
    "encode": ["model", "media", "tokenizer", "core", "loop", "kernels", "public", "config"],
    "vram": ["encode", "model", "media", "tokenizer", "core", "loop", "kernels", "public", "config"],
    "train": ["vram", "encode", "model", "media", "tokenizer", "core", "loop", "kernels", "public", "config"],
}

# Types a layer's files must not name: whose types they are, and the patterns that name one.
NAMES_NO_TYPES = {
    "core": [
        ("model", r"\buform_model\w*_t\b|\bstruct\s+uform_model\w*\b"),
        ("tower", r"\btower\w*_t\b|\bstruct\s+tower\w*\b"),
        ("trainer", r"\buform_trainer\w*_t\b|\bstruct\s+uform_trainer\w*\b|\btrain(er)?_\w+_t\b"
                           r"|\bstruct\s+train(er)?_\w+\b"),
    ],
}

# The include folders of the engine (meson.build's internal_inc), after the including file's own.
INCLUDE_DIRS = [".", "include", "loop", "kernels", "src/core", "src/model", "src/encode", "src/media", "src/vram",
                "src/train", "src/tokenizer"]
# Headers meson writes into the build folder.
GENERATED_HEADERS = ["uform_config.h"]
ENGINE_ARCHIVE = "libuform_internal.a"
SCOPE = "src/"


def layer_of(path):
    best = None
    for prefix, layer in LAYERS.items():
        if (path == prefix or path.startswith(prefix + "/")) and (best is None or len(prefix) > len(best[0])):
            best = (prefix, layer)
    return best[1] if best else None


def strip_comments_and_strings(text, strings=True):
    """The text with comments (and string and character literals, unless `strings` is false) blanked,
    lines kept."""
    pattern = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)

    def blank(match):
        token = match.group(0)
        if token[0] in "\"'":
            return token if not strings else token[0] * 2
        return re.sub(r"[^\n]", " ", token)

    return pattern.sub(blank, text)


def engine_sources(root):
    """Every .c, .cc and .h under src/, relative to the source root."""
    found = []
    for folder, _, names in os.walk(os.path.join(root, SCOPE)):
        for name in names:
            if name.endswith((".c", ".cc", ".h")):
                found.append(os.path.relpath(os.path.join(folder, name), root))
    return sorted(found)


def resolve_include(root, including, name, quoted):
    folders = ([os.path.dirname(including)] if quoted else []) + INCLUDE_DIRS
    for folder in folders:
        candidate = os.path.normpath(os.path.join(folder, name))
        if os.path.isfile(os.path.join(root, candidate)):
            return candidate
    if name in GENERATED_HEADERS:
        return "@build/" + name
    return None


def include_graph(root, files):
    """{file: {included file: line}} over files and every project header they reach."""
    graph, pending = {}, list(files)
    while pending:
        path = pending.pop()
        if path in graph or path.startswith("@build/"):
            continue
        graph[path] = {}
        text = strip_comments_and_strings(open(os.path.join(root, path), encoding="utf-8").read(), strings=False)
        for number, line in enumerate(text.splitlines(), 1):
            match = re.match(r'\s*#\s*include\s*(?:"([^"]*)"|<([^>]*)>)', line)
            if not match:
                continue
            target = resolve_include(root, path, match.group(1) or match.group(2), match.group(1) is not None)
            if target and target != path:
                graph[path].setdefault(target, number)
                pending.append(target)
    return graph


def object_sources(build):
    """{object path relative to the build folder: source path relative to the source root}."""
    mapping = {}
    for entry in json.load(open(os.path.join(build, "compile_commands.json"), encoding="utf-8")):
        source = os.path.normpath(os.path.join(entry["directory"], entry["file"]))
        output = os.path.normpath(os.path.join(entry["directory"], entry["output"]))
        mapping[os.path.relpath(output, build)] = source
    return mapping


def call_graph(nm, build, root):
    """{file: {file it references: {symbol: 'calls' or 'uses'}}} over the engine archive's objects."""
    sources = object_sources(build)
    archive = os.path.join(build, ENGINE_ARCHIVE)
    lines = subprocess.run([nm, "-P", "-A", archive], check=True, capture_output=True, text=True).stdout
    defined, undefined = {}, {}
    for line in lines.splitlines():
        match = re.match(r"^[^\[]*\[(.*)\]: (\S+) (\S)", line)
        if not match:
            raise SystemExit(f"layering: cannot read this line of {nm}: {line!r}")
        member, symbol, kind = match.groups()
        member = os.path.relpath(os.path.join(build, member), build)  # a thin archive's paths are absolute
        source = sources.get(member)
        name = os.path.relpath(source, root) if source else member
        if kind in "Uwv":
            undefined.setdefault(name, set()).add(symbol)
        elif kind.isupper() or kind in "iu":
            defined[symbol] = (name, "calls" if kind in "TWi" else "uses")
    graph = {}
    for name, symbols in undefined.items():
        for symbol in symbols:
            if symbol in defined and defined[symbol][0] != name:
                target, verb = defined[symbol]
                graph.setdefault(name, {}).setdefault(target, {})[symbol] = verb
    return graph


def strongly_connected(graph):
    """Tarjan's strongly connected sets of two or more nodes, each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []
    nodes = sorted(set(graph) | {t for targets in graph.values() for t in targets})

    def visit(start):
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, targets = work[-1]
            advanced = False
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    advanced = True
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    members.append(member)
                    if member == node:
                        break
                if len(members) > 1:
                    found.append(sorted(members))

    for node in nodes:
        if node not in index:
            visit(node)
    return sorted(found)


def shown(path):
    return path.replace("@build/", "<build>/")


def symbols_text(symbols):
    by_verb = {}
    for symbol, verb in sorted(symbols.items()):
        by_verb.setdefault(verb, []).append(symbol)
    return "; ".join(f"{verb} {', '.join(names)}" for verb, names in sorted(by_verb.items()))


def cycle_faults(kind, graph, describe):
    faults = []
    for members in strongly_connected(graph):
        if not any(member.startswith(SCOPE) for member in members):
            continue
        lines = [f"{kind} cycle of {len(members)} files: {', '.join(shown(m) for m in members)}"]
        for source in members:
            for target in sorted(graph.get(source, {})):
                if target in members:
                    lines.append(f"    {shown(source)} -> {shown(target)}: {describe(graph[source][target])}")
        faults.append("\n".join(lines))
    return faults


def crossings(graph):
    """Each edge of `graph` from a file in scope to a layer its rules do not allow: the file, its layer, the
    target as shown, the target's layer (or where it stands outside every layer), and what the edge holds."""
    for path in sorted(graph):
        layer = layer_of(path)
        if not path.startswith(SCOPE) or layer not in RULES:
            continue
        for target, held in sorted(graph[path].items()):
            other = layer_of(target)
            if other != layer and other not in RULES[layer]:
                yield path, layer, shown(target), other or "outside every layer", held


def rule_faults(include, calls):
    faults = []
    for path, layer, target, other, line in crossings(include):
        faults.append(f"include rule: {path}:{line} includes {target} ({other}); "
                      f"{layer} may include only {layer}, {', '.join(RULES[layer])}")
    for path, layer, target, other, symbols in crossings(calls):
        faults.append(f"call rule: {path} -> {target} ({other}): "
                      f"{symbols_text(symbols)}; {layer} may call only {layer}, {', '.join(RULES[layer])}")
    return faults


def type_faults(root, files):
    faults = []
    for path in files:
        rules = NAMES_NO_TYPES.get(layer_of(path), [])
        if not rules:
            continue
        text = strip_comments_and_strings(open(os.path.join(root, path), encoding="utf-8").read())
        whose = [what for what, _ in rules]
        none = ", ".join(whose[:-1]) + " or " + whose[-1] if len(whose) > 1 else whose[0]
        for number, line in enumerate(text.splitlines(), 1):
            for what, pattern in rules:
                for match in re.finditer(pattern, line):
                    faults.append(f"type rule: {path}:{number} names {' '.join(match.group(0).split())} (a {what} "
                                  f"type); {layer_of(path)} names no {none} type")
    return faults


# The self-test's tree: {path: text}. Planted: core_a.h <-> core_b.h includes each other; core_a.c
# includes model_m.h and calls model_m_free, which calls core_run back; core_a.c names uform_model_t in
# code (and in a comment and a string, which do not count); encode/e.c calls into model and core, which
# its layer allows.
SELF_TEST_TREE = {
    "src/core/core_a.h": '#pragma once\n#include "core_b.h"\nint core_run(int x);\n',
    "src/core/core_b.h": '#pragma once\n#include "core_a.h"\n',
    "src/core/core_a.c": '#include "core_a.h"\n#include "model_m.h"\ntypedef struct uform_model uform_model_t;\n'
                         '/* uform_model_t */\nchar const *core_name = "uform_model_t";\n'
                         'int core_run(int x) { return x > 0 ? model_m_free(x - 1) : 0; }\n',
    "src/model/model_m.h": '#pragma once\n#include "core_a.h"\nint model_m_free(int x);\n',
    "src/model/model_m.c": '#include "model_m.h"\nint model_m_free(int x) { return core_run(x); }\n',
    "src/encode/e.c": '#include "model_m.h"\nint e_run(int x);\nint e_run(int x) { return model_m_free(x) + core_run(x); }\n',
}
SELF_TEST_FAULTS = [
    "include cycle of 2 files: src/core/core_a.h, src/core/core_b.h",
    "    src/core/core_a.h -> src/core/core_b.h: line 2",
    "    src/core/core_b.h -> src/core/core_a.h: line 2",
    "call cycle of 2 files: src/core/core_a.c, src/model/model_m.c",
    "    src/core/core_a.c -> src/model/model_m.c: calls model_m_free",
    "    src/model/model_m.c -> src/core/core_a.c: calls core_run",
    "include rule: src/core/core_a.c:2 includes src/model/model_m.h (model); core may include only core, loop, "
    "kernels, public, config",
    "call rule: src/core/core_a.c -> src/model/model_m.c (model): calls model_m_free; core may call only core, loop, "
    "kernels, public, config",
    "type rule: src/core/core_a.c:3 names struct uform_model (a model type); core names no model, tower or trainer type",
    "type rule: src/core/core_a.c:3 names uform_model_t (a model type); core names no model, tower or trainer type",
]


def write_archive(path, members):
    """A System V ar archive of {member name (15 characters at most): bytes}, as nm reads it."""
    with open(path, "wb") as archive:
        archive.write(b"!<arch>\n")
        for name, data in members.items():
            header = f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{644:<8}{len(data):<10}`\n"
            archive.write(header.encode() + data + (b"\n" if len(data) % 2 else b""))


def self_test(cc, nm):
    with tempfile.TemporaryDirectory() as work:
        root, build = os.path.join(work, "source"), os.path.join(work, "build")
        os.makedirs(build)
        for path, text in SELF_TEST_TREE.items():
            os.makedirs(os.path.dirname(os.path.join(root, path)), exist_ok=True)
            open(os.path.join(root, path), "w", encoding="utf-8").write(text)
        commands, members = [], {}
        folders = sorted({"-I" + os.path.join(root, os.path.dirname(p)) for p in SELF_TEST_TREE})
        for path in (p for p in SELF_TEST_TREE if p.endswith(".c")):
            output = os.path.basename(path)[:-2] + ".o"
            subprocess.run(cc.split() + folders + ["-c", os.path.join(root, path), "-o", os.path.join(build, output)],
                           check=True)
            commands.append({"directory": build, "file": os.path.join(root, path), "output": output})
            members[output] = open(os.path.join(build, output), "rb").read()
        json.dump(commands, open(os.path.join(build, "compile_commands.json"), "w", encoding="utf-8"))
        write_archive(os.path.join(build, ENGINE_ARCHIVE), members)
        faults = analyse(root, build, nm)
    got = "\n".join(faults).splitlines()
    if got != SELF_TEST_FAULTS:
        print("layering: the self-test's faults differ from those planted; reported:")
        print("\n".join(got))
        print("planted:")
        print("\n".join(SELF_TEST_FAULTS))
        return 1
    print(f"layering: the self-test reports the {len(faults)} planted faults, exactly")
    return 0


def analyse(root, build, nm):
    files = engine_sources(root)
    include = include_graph(root, files)
    calls = call_graph(nm, build, root)
    return (cycle_faults("include", include, lambda line: f"line {line}") + cycle_faults("call", calls, symbols_text) +
            rule_faults(include, calls) + type_faults(root, files))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source-root")
    parser.add_argument("--build-dir")
    parser.add_argument("--nm", default="nm")
    parser.add_argument("--self-test", action="store_true")
    parser.add_argument("--cc", default="cc")
    args = parser.parse_args()
    if args.self_test:
        return self_test(args.cc, args.nm)
    if not args.source_root or not args.build_dir:
        parser.error("--source-root and --build-dir are required")
    root = os.path.realpath(args.source_root)
    faults = analyse(root, os.path.realpath(args.build_dir), args.nm)
    for fault in faults:
        print("layering: " + fault)
    if faults:
        print(f"layering: {len(faults)} faults")
        return 1
    print(f"layering: the files under {SCOPE}: no cycle, every include, call and type within its layer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
