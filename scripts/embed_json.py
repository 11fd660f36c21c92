#!/usr/bin/env python3
"""Writes a C source that defines one string: a JSON document, checked and made compact.

    embed_json.py INPUT.json OUTPUT.c NAME

The document is parsed first, so that a syntax error fails the build naming its line, then written
without its indentation (non-ASCII characters as JSON escapes) as `char const NAME[]`, in lines of a
C string literal."""

import json
import sys


def c_literal_lines(text, width=100):
    """The text escaped for a C string literal, in pieces of at most `width` characters."""
    line = ""
    for char in text:
        piece = "\\" + char if char in '\\"' else char
        if len(line) + len(piece) > width:
            yield line
            line = ""
        line += piece
    if line:
        yield line


def main():
    source, output, name = sys.argv[1:]
    with open(source, encoding="utf-8") as file:
        try:
            document = json.load(file)
        except json.JSONDecodeError as error:
            sys.exit(f"{source}:{error.lineno}:{error.colno}: not JSON: {error.msg}")
    compact = json.dumps(document, separators=(",", ":"))
    with open(output, "w", encoding="ascii") as file:
        file.write(f"/* Written by scripts/embed_json.py from {source.rsplit('/', 1)[-1]}: do not edit. */\n")
        file.write(f"char const {name}[] =\n")
        for line in c_literal_lines(compact):
            file.write(f'    "{line}"\n')
        file.write(";\n")


if __name__ == "__main__":
    main()
