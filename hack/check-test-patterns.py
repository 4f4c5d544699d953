#!/usr/bin/env python3
"""Every test selector in the Makefile selects something.

`go test -run 'A|B'` with a renamed B prints "no tests to run" for it and exits 0, and
`cargo test -- --skip x` or a positional filter that matches nothing is silent too: a rename
quietly drops a test from `make test`. This reads the Makefile (or the one given), expands its
variables, and checks that

- every alternative of every `go test -run` pattern matches a `func TestX(t *testing.T)` of the
  package the command runs (Go's `-run` is an unanchored regular expression per alternative),
- every `cargo test` filter after `--` (positional or `--skip`) is part of a Rust test's name,
- every `cargo test --test NAME` names a test target in tests/.

Exit 1 with one line per selector that selects nothing. `make lint` runs it.
"""

import pathlib
import re
import shlex
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

# `cargo test -- <harness options>` that take a value (the value is not a filter).
HARNESS_OPTIONS_WITH_VALUE = {"--skip", "--test-threads", "--format", "--color", "--logfile", "-Z"}


def variables(text):
    """`NAME ?= value`, `NAME := value`, `NAME = value` on one line."""
    out = {}
    for m in re.finditer(r"^([A-Za-z0-9_]+)\s*(?:\?|:)?=[ \t]*(.*)$", text, re.M):
        out.setdefault(m.group(1), m.group(2).strip())
    return out


def expand(s, vars_, depth=0):
    if depth > 10:
        return s
    expanded = re.sub(r"\$\(([A-Za-z0-9_]+)\)", lambda m: vars_.get(m.group(1), m.group(0)), s)
    return expanded if expanded == s else expand(expanded, vars_, depth + 1)


def recipe_lines(text):
    """Recipe lines, with backslash continuations joined; recipe comments (`@# …`) left out."""
    joined = re.sub(r"\\\n\s*", " ", text)
    lines = [l.strip() for l in joined.splitlines() if l.startswith("\t")]
    return [l for l in lines if not l.lstrip("@-").startswith("#")]


def go_tests(package_dir):
    names = set()
    for f in package_dir.glob("*_test.go"):
        names.update(re.findall(r"^func (Test\w+)\(\w+ \*testing\.T\)", f.read_text(), re.M))
    return names


def rust_tests():
    """Names of Rust test functions (`#[test]`, `#[tokio::test…]`, proptest's `fn` in `proptest!`
    blocks are counted by their `fn` name too)."""
    names = set()
    for top in ("tests", "src", "crates", "benches"):
        for f in (ROOT / top).rglob("*.rs"):
            lines = f.read_text(errors="replace").splitlines()
            for i, line in enumerate(lines):
                m = re.match(r"\s*(?:pub\s+)?(?:async\s+)?fn\s+(\w+)", line)
                if not m:
                    continue
                before = "\n".join(lines[max(0, i - 6):i])
                if re.search(r"#\[(tokio::)?test|proptest!|#\[ignore", before):
                    names.add(m.group(1))
    return names


def split_alternatives(pattern):
    """Top-level `|` alternatives of a regular expression."""
    out, depth, cur = [], 0, ""
    for ch in pattern:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "|" and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return out


def check(makefile):
    text = makefile.read_text()
    vars_ = variables(text)
    problems = []
    checked = {"go -run alternatives": 0, "cargo filters": 0, "cargo --test targets": 0}
    rust = None
    for raw in recipe_lines(text):
        line = expand(raw, vars_)
        # go test -run '<pattern>' <packages>
        for m in re.finditer(r"-run\s+'([^']*)'\s+(\S+)", line):
            pattern, package = m.group(1), m.group(2)
            cd = re.search(r"cd\s+(\S+)\s*&&", line)
            base = ROOT / cd.group(1) if cd else ROOT
            tests = go_tests((base / package.rstrip("/.").rstrip("/")).resolve())
            for alt in split_alternatives(pattern):
                checked["go -run alternatives"] += 1
                if not any(re.search(alt, t) for t in tests):
                    problems.append(f"go test -run alternative {alt!r} ({package}) matches no test")
        # cargo test … [-- filters]
        for m in re.finditer(r"\bcargo test\b([^;&|]*)", line):
            try:
                words = shlex.split(m.group(1))
            except ValueError:
                words = m.group(1).split()
            before, after = (words[: words.index("--")], words[words.index("--") + 1:]) if "--" in words else (words, [])
            for i, w in enumerate(before):
                if w == "--test" and i + 1 < len(before):
                    name = before[i + 1]
                    checked["cargo --test targets"] += 1
                    if not ((ROOT / "tests" / f"{name}.rs").exists() or (ROOT / "tests" / name / "main.rs").exists()):
                        problems.append(f"cargo test --test {name}: no such test target in tests/")
            filters, skip_next = [], False
            for i, w in enumerate(after):
                if skip_next:
                    skip_next = False
                    continue
                if w in HARNESS_OPTIONS_WITH_VALUE:
                    skip_next = True
                    if w == "--skip" and i + 1 < len(after):
                        filters.append(("--skip", after[i + 1]))
                    continue
                if not w.startswith("-"):
                    filters.append(("filter", w))
            if filters and rust is None:
                rust = rust_tests()
            for kind, f in filters:
                checked["cargo filters"] += 1
                if not any(f in t for t in rust):
                    what = f"--skip {f}" if kind == "--skip" else f"filter {f!r}"
                    problems.append(f"cargo test {what} matches no Rust test")
    # A parser that finds nothing would pass everything: each kind must have been seen.
    for kind, n in checked.items():
        if n == 0:
            problems.append(f"no {kind} found: the check itself is broken")
    return problems, checked


def main():
    makefile = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "Makefile"
    problems, checked = check(makefile)
    print("checked " + ", ".join(f"{n} {kind}" for kind, n in checked.items()))
    for p in problems:
        print(f"{makefile.name}: {p}", file=sys.stderr)
    if problems:
        print("a renamed or removed test? fix the Makefile's selector", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
