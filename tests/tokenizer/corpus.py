"""The texts the tokenizers are checked on: real text of Debian packages, one text per line, and the edge
cases written here.

    corpus.py --out DIR    writes DIR/corpus.txt (UTF-8, one text per line) unless DIR/corpus.stamp says
                           it was built from the same packages by the same script, and prints its lines
                           per script

Sources, each read from the files its package lists (`dpkg-query -L`), in sorted order:
  - translated manual pages (manpages-xx): the roff with its requests and escapes taken out;
  - message catalogs (iso-codes, libc-l10n, gettext, gettext-base): every translation of every .mo;
  - the Unicode Character Database (unicode-data): names and aliases (UnicodeData.txt, NamesList.txt),
    Unihan's readings and definitions beside each ideograph, every assigned code point in runs of 32,
    NormalizationTest.txt's five forms, the emoji test file, and the code point sequences of the
    break and bidi test files.
Lines are stripped; empty lines, lines that are not UTF-8 and lines a line cannot carry (a "\\n" inside,
a "\\r" at the end: the command takes "\\r\\n" for a line's end) are left out; the first of equal lines
is kept, and each source gives at most its share (SOURCES), taken evenly over its lines: some 286,000
lines, 12.7 MB, in about 150 scripts (Debian 12's packages), built in some 10 s. The script of a line
is that of most of its characters (Scripts.txt; Common and Inherited left out); a line without one is
Common. The edge cases (EDGE_CASES, edge_cases) add texts no package has: empty and blank texts, line
ends, emoji sequences, stacked marks, every control, noncharacters, special tokens written in the text,
long words, a text of 50,000 words and one of 1 MiB. Standard library only.
"""

from __future__ import annotations

import argparse
import bisect
import bz2
import collections
import contextlib
import fcntl
import gzip
import hashlib
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

MANUAL_PACKAGES = (
    "manpages-de", "manpages-es", "manpages-fr", "manpages-it", "manpages-ja", "manpages-pl",
    "manpages-ru", "manpages-sr", "manpages-tr", "manpages-uk", "manpages-vi", "manpages-zh",
)
CATALOG_PACKAGES = ("iso-codes", "libc-l10n", "gettext", "gettext-base")
UNICODE_PACKAGE = "unicode-data"
PACKAGES = MANUAL_PACKAGES + CATALOG_PACKAGES + (UNICODE_PACKAGE,)

MINIMUM_LINES = 200_000
# A language of the message catalogs gives at most this many lines, so that the many Latin-script languages
# of iso-codes leave room for the others.
CATALOG_LINES_PER_LANGUAGE = 1_000


class MissingPackages(Exception):
    """Debian packages the corpus reads that are not installed (`packages`)."""

    def __init__(self, packages: list):
        super().__init__("not installed: " + " ".join(packages))
        self.packages = packages


# ---------------------------------------------------------------------------------------------------
# Package files


def package_files(package: str) -> list:
    """The regular files `package` installed, sorted; MissingPackages where it is not installed."""
    listing = subprocess.run(["dpkg-query", "-L", package], capture_output=True, text=True)
    if listing.returncode != 0:
        raise MissingPackages([package])
    return sorted(p for p in set(listing.stdout.splitlines()) if p and Path(p).is_file()
                  and not Path(p).is_symlink())


def package_versions() -> dict:
    """{package: installed version} of every package the corpus reads; MissingPackages names the absent."""
    query = subprocess.run(["dpkg-query", "-W", "-f=${Package} ${db:Status-Status} ${Version}\n", *PACKAGES],
                           capture_output=True, text=True)
    versions = {}
    for line in query.stdout.splitlines():
        name, status, version = (line.split(" ", 2) + ["", ""])[:3]
        if status == "installed":
            versions[name] = version
    missing = [p for p in PACKAGES if p not in versions]
    if missing:
        raise MissingPackages(missing)
    return versions


# ---------------------------------------------------------------------------------------------------
# Manual pages: roff to text

# The roff requests whose arguments are text (font and heading macros); every other request line is dropped.
TEXT_REQUESTS = {"B", "I", "BR", "BI", "IB", "IR", "RB", "RI", "SB", "SM", "SH", "SS", "IP", "TP", "TQ",
                 "UR", "MT", "OP", "Nm", "Nd", "Sh", "Ss", "Dt", "Fn", "Fa", "Ar", "Fl", "Xr", "Pa", "Em"}
SPECIAL_CHARACTERS = {
    "em": "\u2014", "en": "\u2013", "bu": "\u2022", "co": "\u00a9", "rg": "\u00ae", "tm": "\u2122",
    "aq": "'", "dq": '"', "lq": "\u201c", "rq": "\u201d", "oq": "\u2018", "cq": "\u2019", "ti": "~",
    "ha": "^", "rs": "\\", "mi": "\u2212", "pl": "+", ">=": "\u2265", "<=": "\u2264", "mu": "\u00d7",
    "->": "\u2192", "<-": "\u2190", "hy": "-", "Fo": "\u00ab", "Fc": "\u00bb", "fo": "\u2039",
    "fc": "\u203a", "de": "\u00b0", "sc": "\u00a7", "ga": "`", "aa": "\u00b4", "lB": "[", "rB": "]",
    "lC": "{", "rC": "}", "ba": "|", "or": "|", "at": "@", "sh": "#", "Do": "$", "ps": "\u00b6",
    "dg": "\u2020", "ss": "\u00df", "a:": "\u00e4", "o:": "\u00f6", "u:": "\u00fc", "A:": "\u00c4",
    "O:": "\u00d6", "U:": "\u00dc", "e'": "\u00e9", "e`": "\u00e8", "ff": "\ufb00", "fi": "\ufb01",
    "fl": "\ufb02", "+-": "\u00b1", "!=": "\u2260", "==": "\u2261", "no": "\u00ac", "eu": "\u20ac",
    "Eu": "\u20ac", "sl": "/", "ul": "_", "ru": "_", "bv": "|", "ci": "\u25cb", "sq": "\u25a1",
}
ESCAPE = re.compile(
    r"\\(?:"
    r"f(?:\[[^\]]*\]|\(..|.)"                  # font changes
    r"|\((?P<two>..)"                          # \(xx special characters
    r"|\[(?P<long>[^\]]*)\]"                   # \[name] special characters, \[uXXXX]
    r"|\*(?:\[[^\]]*\]|\(..|.)"                # string interpolations
    r"|n[+-]?(?:\[[^\]]*\]|\(..|.)"            # number registers
    r"|s[+-]?(?:\d\d?|\[[^\]]*\]|\(\d\d|'[^']*')"  # size changes
    r"|[hvwlLxbCoDNRSXZHkmMjAY]'[^']*'"          # \h'...' and the like
    r"|[kmMgYV](?:\[[^\]]*\]|\(..|.)"          # marks, colours
    r"|\$[0-9*@]"                              # macro arguments
    r"|(?P<one>.)"                             # one-character escapes
    r")")
ONE_CHARACTER = {"-": "-", "e": "\\", "\\": "\\", " ": " ", "~": " ", "0": " ", ".": ".", "'": "'",
                 "`": "`", '"': "", "&": "", "|": "", "^": "", "c": "", "%": "", ":": "", "/": "",
                 ",": "", "!": "", "p": "", "t": "\t", "a": "", "d": "", "u": "", "r": "", "{": "",
                 "}": "", "z": "", "E": "\\", "@": ""}


def roff_escape(match: re.Match) -> str:
    """The text one roff escape stands for ('' for formatting)."""
    if match.group("two") is not None:
        return SPECIAL_CHARACTERS.get(match.group("two"), "")
    if match.group("long") is not None:
        name = match.group("long")
        if re.fullmatch(r"u[0-9A-F]{4,6}", name):
            code = int(name[1:], 16)
            return "" if 0xD800 <= code < 0xE000 or code > 0x10FFFF else chr(code)
        return SPECIAL_CHARACTERS.get(name, "")
    if match.group("one") is not None:
        return ONE_CHARACTER.get(match.group("one"), match.group("one"))
    return ""


def request_arguments(rest: str) -> str:
    """A request's arguments as text: quoted arguments unquoted, joined by spaces."""
    return " ".join(a[1:-1] if len(a) > 1 and a[0] == a[-1] == '"' else a
                    for a in re.findall(r'"[^"]*"|\S+', rest))


def roff_lines(source: str):
    """The text lines of a manual page's roff: comments, requests other than the font and heading
    macros, macro definitions and tbl's format lines dropped; escapes replaced by their text."""
    in_definition = in_table_format = False
    for line in source.split("\n"):
        if in_definition:
            in_definition = not line.startswith("..")
            continue
        if in_table_format:
            in_table_format = not line.rstrip().endswith(".")
            continue
        comment = line.find('\\"')
        if comment >= 0:
            line = line[:comment]
        if line[:1] in (".", "'"):
            parts = line[1:].strip().split(None, 1)
            name = parts[0] if parts else ""
            if name in ("de", "de1", "am", "ig"):
                in_definition = True
                continue
            if name == "TS":
                in_table_format = True
                continue
            if name not in TEXT_REQUESTS or len(parts) < 2:
                continue
            line = request_arguments(parts[1])
        yield ESCAPE.sub(roff_escape, line)


def manual_lines(package: str):
    """The lines of every manual page `package` installed, page by page in sorted path order."""
    for path in package_files(package):
        if "/man/" not in path or not path.endswith(".gz"):
            continue
        try:
            source = gzip.decompress(Path(path).read_bytes()).decode("utf-8")
        except (UnicodeDecodeError, OSError, EOFError):
            continue
        yield from roff_lines(source)


def every_nth(lines: list, most: int) -> list:
    """At most `most` of `lines`, taken evenly over them in order."""
    if len(lines) <= most:
        return lines
    return [lines[i * len(lines) // most] for i in range(most)]


# ---------------------------------------------------------------------------------------------------
# Message catalogs


def catalog_translations(data: bytes):
    """The translations of a GNU .mo file (every plural form; the header entry left out), as text; none
    where the file is not a .mo or a translation is not UTF-8."""
    if len(data) < 28:
        return
    magic = struct.unpack("<I", data[:4])[0]
    order = "<" if magic == 0x950412DE else ">" if magic == 0xDE120495 else None
    if order is None:
        return
    _, count, originals, translations = struct.unpack(order + "4I", data[4:20])
    for i in range(count):
        length, offset = struct.unpack(order + "2I", data[originals + 8 * i:originals + 8 * i + 8])
        if length == 0:
            continue  # the header
        length, offset = struct.unpack(order + "2I", data[translations + 8 * i:translations + 8 * i + 8])
        for form in data[offset:offset + length].split(b"\0"):
            try:
                yield form.decode("utf-8")
            except UnicodeDecodeError:
                pass


def catalog_lines(package: str):
    """The lines of the translations in the .mo files of `package`, language by language (in sorted
    order), at most CATALOG_LINES_PER_LANGUAGE of each, taken evenly over its files in sorted order."""
    languages = collections.defaultdict(dict)
    for path in package_files(package):
        if path.endswith(".mo") and "/locale/" in path:
            language = path.split("/locale/", 1)[1].split("/", 1)[0]
            for translation in catalog_translations(Path(path).read_bytes()):
                languages[language].update(dict.fromkeys(line.strip(" \t") for line in translation.split("\n")))
    for language in sorted(languages):
        yield from every_nth([line for line in languages[language] if line], CATALOG_LINES_PER_LANGUAGE)


# ---------------------------------------------------------------------------------------------------
# The Unicode Character Database


def text_of_code_points(field: str) -> str:
    """"0041 0308" as the text "A\u0308" (surrogates left out)."""
    return "".join(chr(int(c, 16)) for c in field.split() if not 0xD800 <= int(c, 16) < 0xE000)


def data_lines(path: Path):
    """The data lines of a UCD file (comments and blank lines left out), bzip2 read where it ends .bz2."""
    raw = bz2.decompress(path.read_bytes()) if path.suffix == ".bz2" else path.read_bytes()
    for line in raw.decode("utf-8").split("\n"):
        line = line.split("#", 1)[0].rstrip() if not line.startswith("\t") else line
        if line.strip():
            yield line


def assigned_code_points(unicode_data: Path) -> list:
    """Every code point UnicodeData.txt assigns (its First/Last ranges expanded), surrogates left out and
    the private use areas cut to their first 64."""
    points, first = [], None
    for line in data_lines(unicode_data):
        fields = line.split(";")
        code, name = int(fields[0], 16), fields[1]
        if name.endswith(", First>"):
            first = code
        elif name.endswith(", Last>"):
            points.extend(range(first, min(code + 1, first + 64) if "Private Use" in name else code + 1))
        else:
            points.append(code)
    return [c for c in points if not 0xD800 <= c < 0xE000]


def unicode_names(folder: Path):
    """Each character of UnicodeData.txt with its name, and with its old name where it has one."""
    for line in data_lines(folder / "UnicodeData.txt"):
        fields = line.split(";")
        code = int(fields[0], 16)
        if not fields[1].startswith("<") and not 0xD800 <= code < 0xE000:
            yield f"{chr(code)} {fields[1]}"
            if fields[10]:
                yield f"{chr(code)} {fields[10]}"


def code_point_runs(folder: Path):
    """Every assigned code point, in order, in runs of 32."""
    points = assigned_code_points(folder / "UnicodeData.txt")
    for start in range(0, len(points), 32):
        yield "".join(chr(c) for c in points[start:start + 32])


def names_list(folder: Path):
    """NamesList.txt's aliases, notes and block headings."""
    for line in data_lines(folder / "NamesList.txt"):
        if line.startswith(("\t=", "\t*", "@\t\t")):
            yield line[2:].strip()


def unihan_readings(folder: Path):
    """Each ideograph with its readings (Mandarin, Cantonese, Korean, Japanese, Vietnamese) and its
    definition."""
    readings = collections.defaultdict(list)
    for line in data_lines(folder / "Unihan_Readings.txt.bz2"):
        code, field, value = line.split("\t", 2)
        if field in ("kDefinition", "kMandarin", "kHangul", "kJapaneseKun", "kJapaneseOn", "kVietnamese",
                     "kCantonese", "kKorean"):
            value = re.sub(r":[0-9A-Z]+", "", value) if field == "kHangul" else value
            readings[int(code[2:], 16)].append(value)
    for code in sorted(readings):
        yield f"{chr(code)} " + " ".join(readings[code])


def normalization_tests(folder: Path):
    """The source of each normalization test alone, and its five forms side by side."""
    for line in data_lines(folder / "NormalizationTest.txt.bz2"):
        if not line.startswith("@"):
            forms = [text_of_code_points(f) for f in line.split(";")[:5]]
            yield forms[0]
            yield " ".join(forms)


def emoji_tests(folder: Path):
    """Every emoji sequence of emoji-test.txt with its name ("😀 E1.0 grinning face")."""
    for line in (folder / "emoji" / "emoji-test.txt").read_bytes().decode("utf-8").split("\n"):
        if "; fully-qualified" in line or "; minimally-qualified" in line or "; component" in line:
            yield line.split("#", 1)[1].strip()


def segmentation_tests(folder: Path):
    """The code point sequences of the grapheme, word, sentence and line break tests."""
    for name in ("GraphemeBreakTest.txt", "WordBreakTest.txt", "SentenceBreakTest.txt", "LineBreakTest.txt"):
        for line in data_lines(folder / "auxiliary" / name):
            yield text_of_code_points(re.sub("[\u00f7\u00d7]", " ", line))


def bidi_tests(folder: Path):
    """The code point sequences of the bidi character test."""
    for line in data_lines(folder / "BidiCharacterTest.txt"):
        yield text_of_code_points(line.split(";")[0])


def unicode_folder() -> Path:
    """Where unicode-data installed UnicodeData.txt."""
    for path in package_files(UNICODE_PACKAGE):
        if path.endswith("/UnicodeData.txt"):
            return Path(path).parent
    raise MissingPackages([UNICODE_PACKAGE])


# The sources in order, each a reader, its argument (None: the Unicode folder) and the most lines it
# gives: some 280,000 lines, 11 MB, of which no source is more than a seventh.
SOURCES = (
    (unicode_names, None, 12_000),
    (code_point_runs, None, 10_000),
    (names_list, None, 8_000),
    (unihan_readings, None, 20_000),
    (normalization_tests, None, 15_000),
    (emoji_tests, None, 10_000),
    (segmentation_tests, None, 15_000),
    (bidi_tests, None, 5_000),
    (catalog_lines, "iso-codes", 60_000),
    (catalog_lines, "libc-l10n", 40_000),
    (catalog_lines, "gettext", 20_000),
    (catalog_lines, "gettext-base", 2_000),
) + tuple((manual_lines, package, 9_000) for package in MANUAL_PACKAGES)


# ---------------------------------------------------------------------------------------------------
# Scripts

class Scripts:
    """The Script property of every code point, from Scripts.txt in the Unicode folder."""

    def __init__(self, folder: Path):
        ranges = []
        for line in data_lines(folder / "Scripts.txt"):
            points, script = (field.strip() for field in line.split(";"))
            first, _, last = points.partition("..")
            ranges.append((int(first, 16), int(last or first, 16), script))
        ranges.sort()
        self.starts = [r[0] for r in ranges]
        self.ranges = ranges
        self.cache: dict = {}

    def of(self, character: str) -> str:
        """The script of `character`: "Latin", "Han", "Common", "Inherited" (combining marks), "Unknown"."""
        script = self.cache.get(character)
        if script is None:
            code = ord(character)
            i = bisect.bisect_right(self.starts, code) - 1
            script = self.ranges[i][2] if i >= 0 and code <= self.ranges[i][1] else "Unknown"
            self.cache[character] = script
        return script

    def of_line(self, line: str) -> str:
        """The script of most of the characters of `line` that have one (Common and Inherited left out);
        "Common" where none has."""
        if line.isascii():
            return "Latin" if any(c.isalpha() for c in line) else "Common"
        counts = collections.Counter(map(self.of, line))
        for shared in ("Common", "Inherited"):
            counts.pop(shared, None)
        return counts.most_common(1)[0][0] if counts else "Common"


def script_counts(lines: list) -> list:
    """[(script, lines)] most lines first, then by name."""
    scripts = Scripts(unicode_folder())
    counts = collections.Counter(map(scripts.of_line, lines))
    return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


# ---------------------------------------------------------------------------------------------------
# The corpus


def fits_a_line(text: str) -> bool:
    """Whether `text` can be a line of the command's input: no "\\n" in it, no "\\r" at its end."""
    return "\n" not in text and not text.endswith("\r")


def collect() -> list:
    """The corpus's lines: each source in turn (SOURCES), without the lines seen before, at most its
    share taken evenly over what it gives."""
    folder = unicode_folder()
    seen, lines = set(), []
    for reader, argument, most in SOURCES:
        fresh = dict.fromkeys(line.strip(" \t") for line in reader(folder if argument is None else argument))
        chosen = every_nth([line for line in fresh if line and fits_a_line(line) and line not in seen], most)
        if not chosen:
            raise RuntimeError(f"{reader.__name__}({argument or folder}) gives no lines: are its package's files "
                               "on disk? (a dpkg path-exclude, as in slim images, drops manuals and catalogs)")
        seen.update(chosen)
        lines.extend(chosen)
    return lines


def stamp_of(versions: dict) -> str:
    """What a built corpus depends on: this script and the versions of the packages it reads."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for package in sorted(versions):
        digest.update(f"{package}={versions[package]}\n".encode())
    return digest.hexdigest()


# Where the environment names a folder in UFORM_TEST_CACHE, the corpus and the tokenizer fixtures
# (fixtures.py) are built there once, for every build folder and test that asks for them (each still checks
# its stamp), instead of into each test's own folder: CI builds the engine several times.
CACHE_VARIABLE = "UFORM_TEST_CACHE"


def cached(out: Path, name: str) -> Path:
    """The folder to build into: UFORM_TEST_CACHE/name where that variable is set, else `out`."""
    cache = os.environ.get(CACHE_VARIABLE)
    return Path(cache) / name if cache else out


@contextlib.contextmanager
def locked(folder: Path):
    """Holds folder/.lock exclusively: tests that run at once build a shared folder one at a time."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build(out: Path) -> Path:
    """Writes out/corpus.txt (or UFORM_TEST_CACHE/corpus/corpus.txt: cached) unless the stamp beside it
    matches; answers its path. MissingPackages where a package it reads is not installed."""
    out = cached(out, "corpus")
    with locked(out):
        return build_locked(out)


def build_locked(out: Path) -> Path:
    corpus, stamp_path = out / "corpus.txt", out / "corpus.stamp"
    stamp = stamp_of(package_versions())
    if corpus.exists() and stamp_path.exists() and stamp_path.read_text() == stamp:
        return corpus
    lines = collect()
    if len(lines) < MINIMUM_LINES:
        raise RuntimeError(f"the corpus has {len(lines)} lines, fewer than {MINIMUM_LINES}")
    temporary = corpus.with_suffix(".tmp")
    temporary.write_bytes("".join(line + "\n" for line in lines).encode("utf-8"))
    temporary.replace(corpus)
    stamp_path.write_text(stamp)
    return corpus


def read_corpus(path: Path) -> list:
    """The texts of a corpus file (split at "\n" only: a "\r" inside a text stays)."""
    return path.read_bytes().decode("utf-8").split("\n")[:-1]


# ---------------------------------------------------------------------------------------------------
# Edge cases: (name, text), written for the tokenizers' corners; the invisible characters as escapes.

C0 = [chr(c) for c in range(0x20) if c != 0x0A]
C1 = [chr(c) for c in range(0x80, 0xA0)]
EDGE_CASES = [
    # Nothing, and only spaces.
    ("empty", ""),
    ("one space", " "),
    ("spaces", " " * 7),
    ("many spaces between words", "a" + " " * 300 + "b"),
    ("tab", "\t"),
    ("tabs", "a\tb\t\tc\t"),
    ("spaces around", "   leading and trailing   "),
    ("unicode spaces", "a\u00a0b\u1680c\u2000d\u2003e\u2009f\u200ag\u202fh\u205fi\u3000j"),
    ("separators", "line\u2028separator\u2029paragraph\x85next\x0bvertical\x0cform feed"),
    ("ideographic space only", "\u3000\u3000"),
    # Line ends: given as arguments (or NUL-separated), never as a line.
    ("newline", "\n"),
    ("newlines", "first line\nsecond line\n\nfourth"),
    ("crlf", "one\r\ntwo\r\n"),
    ("carriage return at end", "text\r"),
    ("carriage return only", "\r"),
    ("carriage return inside", "over\rwrite"),
    # Emoji.
    ("emoji", "\U0001f600\U0001f602\U0001f923 smile"),
    ("skin tones", "\U0001f44d\U0001f3fb \U0001f44d\U0001f3fd \U0001f44d\U0001f3ff \U0001f3fd"),
    ("zwj family", "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 family"),
    ("zwj with skin tones", "\U0001f9d1\U0001f3ff\u200d\U0001f91d\u200d\U0001f9d1\U0001f3fb"),
    ("rainbow and pirate flags", "\U0001f3f3\ufe0f\u200d\U0001f308 \U0001f3f4\u200d\u2620\ufe0f"),
    ("regional indicator flags", "\U0001f1fa\U0001f1f8\U0001f1e9\U0001f1ea\U0001f1ef\U0001f1f5 flags"),
    ("lone regional indicator", "\U0001f1fa x \U0001f1f8"),
    ("tag sequence flag", "\U0001f3f4\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f Scotland"),
    ("variation selectors", "\u2764\ufe0f \u2764 \u2764\ufe0e \u263a\ufe0f"),
    ("keycaps", "1\ufe0f\u20e3 #\ufe0f\u20e3 *\u20e3"),
    ("emoji of unicode 15", "\U0001fae8 \U0001f6dc \U0001fa75 \U0001fabf"),
    # Combining marks.
    ("stacked combining marks",
     "Z\u0334\u0321\u032a\u032b\u0356\u0325\u0314\u033f\u0303\u0308\u030f\u030e\u0360\u035d"
     "a\u0336\u0321\u0327\u0330\u0329\u032d\u032e\u031d\u0349\u0355\u0353\u0329\u0314\u0305\u030d"
     "l\u0338\u0317\u0359\u032c\u0339\u0355\u0309\u034a\u033f\u030b\u0313\u030d"
     "g\u0335\u0321\u0333\u0329\u0331\u0330\u032d\u032a\u0323\u0333\u031e\u0350\u0357\u030f\u030d"
     "o\u0301\u0335\u0321\u0322\u031f\u032a\u032d\u0329\u031d\u032d\u0354\u0359\u030a\u0300\u033d\u033d"),
    ("fifty acute accents", "a" + "\u0301" * 50 + "b"),
    ("combining mark first", "\u0301\u0302abc"),
    ("combining marks alone", "\u0300 \u0301 \u0327 \u0338 \u20dd"),
    ("decomposed and composed", "e\u0301 \u00e9 A\u030a \u00c5 \u212b n\u0303 \u00f1"),
    ("decomposed vietnamese", "Ti\u00ea\u0301ng Vi\u00ea\u0323t co\u0301 d\u00e2\u0301u"),
    ("canonical order", "a\u0323\u0307 a\u0307\u0323 \u1e0b\u0323 \u1e0d\u0307 q\u0307\u0323"),
    ("hangul jamo", "\u1100\u1161\u11a8 \uac01 \u1100\u1161 \u11a8 \u3131\u314f"),
    ("devanagari conjuncts",
     "\u0915\u094d\u200d\u0937 \u0915\u094d\u0937 \u0915\u093f \u0928\u092e\u0938\u094d\u0924\u0947"),
    # CJK.
    ("chinese", "\u4e2d\u6587\u5206\u8bcd\u6d4b\u8bd5\uff1a\u6211\u4eec\u5728\u5317\u4eac\u3002"),
    ("japanese", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3001"
                 "\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a\u3002"),
    ("korean", "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8\uc785\ub2c8\ub2e4."),
    ("cjk extensions",
     "\u3400\u4db5 \U00020000\U0002a6d6 \U0002a700 \U0002b740 \U0002b820 \U0002ceb0 \U00030000 \U00031350"),
    ("cjk compatibility", "\uf900\ufa0e\ufa6d \U0002f800\U0002fa1d \u2f00\u2fd5 \u2e80"),
    ("halfwidth katakana", "\uff76\uff80\uff76\uff85 \uff8a\uff9e\uff8a\uff9f"),
    ("ideographic variation sequence", "\u908a\U000e0100 \u908a\U000e0101 \u845b\U000e0100"),
    ("mixed scripts", "Hello, \u4e16\u754c! \u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440. "
                      "\u0645\u0631\u062d\u0628\u0627 \U0001f30d"),
    ("thai without spaces", "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22\u0e44\u0e21\u0e48\u0e21\u0e35\u0e01\u0e32\u0e23"
                            "\u0e40\u0e27\u0e49\u0e19\u0e27\u0e23\u0e23\u0e04"),
    # Right to left.
    ("arabic with embedding", "\u202b\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645\u202c"),
    ("hebrew with marks", "\u200f\u05e9\u05dc\u05d5\u05dd\u200e world \u05e2\u05d5\u05dc\u05dd"),
    ("right-to-left override", "abc \u202e desrever \u202c def"),
    ("bidi isolates", "\u2067\u05d0\u05d1\u2069 \u2066ltr\u2069 \u2068first strong\u2069"),
    ("arabic harakat and tatweel", "\u0639\u064e\u0631\u064e\u0628\u0650\u064a\u0651 \u0640\u0640\u0640 \ufdfa \ufdfd"),
    ("arabic presentation forms", "\ufe8d\ufe8e\ufe8f\ufe90 \ufefb \ufef5"),
    # Controls.
    ("every C0 control but the newline", "".join(C0)),
    *[(f"C0 control U+{ord(c):04X} between letters", f"a{c}b") for c in C0],
    ("delete", "a\x7fb"),
    ("every C1 control", "".join(C1)),
    *[(f"C1 control U+{ord(c):04X} between letters", f"a{c}b") for c in C1],
    ("NUL alone", "\x00"),
    ("NUL inside", "before\x00after"),
    ("NULs", "\x00\x00 \x00"),
    # Invisible format characters.
    ("soft hyphens", "co\u00adop\u00aderation \u00ad"),
    ("zero widths", "zero\u200bwidth\u200cnon\u200djoiner\u2060word\ufeffbom"),
    ("byte order mark first", "\ufeffBOM at the start"),
    ("mongolian vowel separator", "a\u180eb"),
    ("invisible operators", "x\u2062y\u2063z\u2064w \u2061"),
    # Compatibility forms.
    ("ligatures", "\ufb01nancial \ufb02ow \ufb00 \ufb03 \ufb04 \ufb05 \ufb06 \u0132 \u0133 \u01c4 \u01c5 \u01c6"),
    ("full-width forms", "\uff21\uff22\uff23\uff11\uff12\uff13\uff01\uff1f"
                         "\uff46\uff55\uff4c\uff4c\u3000\uff57\uff49\uff44\uff54\uff48"),
    ("enclosed and super", "\u2460\u2461\u2462 \u2170\u2171\u2172 \u00b9\u00b2\u00b3 \u00bd \u338f \u337b \u33ff"),
    ("mathematical letters", "\U0001d400\U0001d401\U0001d402 \U0001d54f \U0001d4b3 \U0001d7ce"),
    ("singletons", "\u212a \u2126 \u212b \u1fef \u0374 \u037e"),
    ("long expansions", "\ufdfa \u3300 \u33af \u2474 \u2488 \u01c4"),
    ("halfwidth voiced marks", "\uff8a\uff9e \u30cf\u3099 \u309b \u3099"),
    # Case.
    ("turkish dotted and dotless i", "\u0130stanbul \u0131i I\u0130 D\u0130YARBAKIR \u0130\u0130\u0130"),
    ("dotted capital I alone", "\u0130"),
    ("german sharp s", "Stra\u00dfe STRASSE \u1e9e \u00df \u1e9e\u1e9e"),
    ("greek final sigma",
     "\u039f\u0394\u03a5\u03a3\u03a3\u0395\u03a5\u03a3 "
     "\u1f48\u03b4\u03c5\u03c3\u03c3\u03b5\u03cd\u03c2 \u03c3\u03c2 \u03a3"),
    ("special casing", "\u01f0 \u0149 \u0390 \u1e96 \ufb00 \u0587 \u1f80 \u1fbc \u1fb3"),
    ("title case letters", "\u01c5 \u01c8 \u01cb \u01f2"),
    ("cherokee", "\u13a0\u13a1 \uab70\uab71"),
    # Replacement character, noncharacters, private use, unassigned.
    ("replacement character", "\ufffd"),
    ("replacement characters in text", "bad \ufffd\ufffd bytes\ufffd"),
    ("noncharacters", "\ufdd0\ufdef \ufffe\uffff \U0001fffe \U0010ffff"),
    ("private use", "\ue000\uf8ff \U000f0000 \U0010fffd a\ue123b"),
    ("unassigned", "\u0378\u0379 \u0e5c \U000e0080 \U0002fffd \U0003134b a\u0378b"),
    ("last code point", "\U0010ffff"),
    # Special tokens written in the text.
    ("bert special tokens", "[CLS] hello [SEP] [MASK] [PAD] [UNK]"),
    ("bert special tokens adjacent", "hello[MASK]world[SEP][SEP]"),
    ("bert special tokens other case", "[cls] [Mask] [ CLS ] [[CLS]]"),
    ("roberta special tokens", "<s> </s> <mask> <pad> <unk>"),
    ("mask after spaces", "The capital is   <mask>."),
    ("roberta special tokens adjacent", "<s>text</s><mask>x<<s>>"),
    ("clip special tokens", "<|startoftext|> a photo <|endoftext|>"),
    ("clip special tokens adjacent", "a<|endoftext|>b<|startoftext|><|endoftext|>"),
    ("special token prefixes", "[CL <mas <|endof [MASK <s"),
    # Long words and long runs.
    ("word of 99 letters", "a" * 99),
    ("word of 100 letters", "a" * 100),
    ("word of 101 letters", "a" * 101),
    ("long compound", "Donaudampfschifffahrtselektrizit\u00e4tenhauptbetriebswerkbauunterbeamtengesellschaft"),
    ("long repeated word", "antidisestablishmentarianism" * 5),
    ("long accented word", "\u00fc" * 150),
    ("word of 5000 letters", "x" * 5000),
    ("long digits", "1234567890" * 20),
    ("long punctuation", "!" * 300),
    ("long dashes", "-" * 200 + " " + "\u2014" * 50),
    ("long url", "https://example.com/" + "path/" * 50 + "?q=" + "v" * 40),
    ("long cjk run", "\u6f22\u5b57" * 200),
    ("long emoji run", "\U0001f600" * 300),
    # Numbers and apostrophes.
    ("numbers", "3.14159 1,000,000 1e-10 0x1F -42 +7 \u0661\u0662\u0663 \u0967\u0968 \u2155"),
    ("contractions", "I'm don't we'll they're it's ISN'T 'quoted' rock'n'roll o'clock ''"),
    ("contractions in capitals", "I'M WE'LL THEY'VE SHE'D"),
    ("hyphenated", "state-of-the-art e-mail re-enter -lead trail-"),
    ("quotes", "\u201csmart\u201d \u2018quotes\u2019 \u00abguillemets\u00bb \u201elow\u201c \u300cbrackets\u300d"),
    ("ellipsis and dashes", "wait\u2026 what\u2014no\u2013yes ... -- ---"),
    ("code", "for (int i = 0; i < n; ++i) { x[i] = y[i] * 2; } // done"),
    ("markup", "<p class=\"x\">Hello &amp; <b>world</b></p>"),
    ("email and handles", "user.name+tag@example.co.uk @handle #hashtag"),
]


# tokenizers 0.19.1 reads its Unicode from Rust crates older than the engine's utf8proc (Unicode 15.0): its
# normal forms and StripAccents from Unicode 9.0, BertNormalizer's and the punctuation pre-tokenizers'
# categories from 8.0 (docs/DESIGN.md, "Tokenizers"). Where the two disagree, neither is wrong, only older:
# the code points that can be cut differently are those assigned after 8.0 that are marks, format
# characters or punctuation, or that have a decomposition or a combining class, and the few whose General
# Category changed since 8.0 (found by the component checks, which compare every code point alone).
REFERENCE_UNICODE = (8, 0)
CATEGORY_CHANGED = frozenset({0x166D, 0x1734, 0x1885, 0x1886, 0xA9BD, 0x111C9})
VERSIONED_CATEGORIES = ("M", "Cf", "P")


def versioned_code_points() -> frozenset:
    """The code points whose cut depends on the Unicode version (above), from Debian's unicode-data."""
    late = set()
    for line in open(unicode_folder() / "DerivedAge.txt", encoding="utf-8"):
        fields = line.split("#")[0].split(";")
        if len(fields) < 2:
            continue
        first, _, last = fields[0].strip().partition("..")
        age = tuple(int(part) for part in fields[1].strip().split("."))
        if age > REFERENCE_UNICODE:
            late.update(range(int(first, 16), int(last or first, 16) + 1))
    versioned = set(CATEGORY_CHANGED)
    for line in open(unicode_folder() / "UnicodeData.txt", encoding="utf-8"):
        fields = line.split(";")
        code = int(fields[0], 16)
        if code in late and (fields[2].startswith(VERSIONED_CATEGORIES) or fields[3] != "0" or fields[5]):
            versioned.add(code)
    return frozenset(versioned)


def is_versioned(text: str, versioned: frozenset) -> bool:
    """Whether `text` holds a code point whose cut depends on the Unicode version."""
    return not versioned.isdisjoint(map(ord, text))


def many_words(count: int) -> str:
    """`count` one-letter words."""
    return " ".join(["x"] * count)


def megabyte_text(lines: list) -> str:
    """A text of at least 1 MiB made of corpus lines, every 97th (round and round) joined by spaces, leaving
    out those that hold a code point whose cut depends on the Unicode version."""
    versioned = versioned_code_points()
    parts, size, at = [], 0, 0
    while size < 1 << 20:
        line = lines[at * 97 % len(lines)]
        at += 1
        if is_versioned(line, versioned):
            continue
        parts.append(line)
        size += len(line.encode("utf-8")) + 1
    return " ".join(parts)


def edge_cases(lines: list) -> list:
    """The edge cases, then many words and the 1 MiB text made of `lines`: [(name, text)]."""
    return EDGE_CASES + [("50,000 words", many_words(50_000)), ("1 MiB of corpus lines", megabyte_text(lines))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the folder of corpus.txt (a build folder)")
    args = parser.parse_args()
    try:
        corpus = build(args.out)
    except MissingPackages as error:
        print(f"{error}: apt-get install {' '.join(error.packages)}", file=sys.stderr)
        return 1
    lines = read_corpus(corpus)
    counts = script_counts(lines)
    print(f"{corpus}: {len(lines)} lines, {sum(len(l.encode()) for l in lines)} bytes, {len(counts)} scripts")
    for script, count in counts:
        print(f"{count:9d}  {script}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
