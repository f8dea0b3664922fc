#!/usr/bin/python3
# SPDX-License-Identifier: MIT
"""Check the module dependency table of docs/ARCHITECTURE.md against the code.

Reads the "## Modules" table (module, public header, owns, depends on) and
every #include "..." in pkg-*/ and cmd/. A module may include its own files,
and of another module only its one public header, and only when that module
is listed in its "depends on" column ("all of the above" lists every row
above). A listed module must stand above the one listing it, so the table
is an order and the dependencies cannot form a cycle. Every pkg-* directory
must have a row. Prints "ok - ..." / "not ok - ..." lines (tests/run.sh
counts them) and exits 1 on any failure.

Usage: check_layers.py [TOP]   (default: the repository this file is in)
"""
import os
import re
import sys

TOP = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                      os.path.join(os.path.dirname(__file__), "..", ".."))
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
MODULE_NAME = re.compile(r"`([^`]+)`")


def read_table():
    """[(module, public_header or None, [deps])] in table order."""
    text = open(os.path.join(TOP, "docs", "ARCHITECTURE.md")).read()
    section = text.split("## Modules", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 4 or not cells[0].startswith("`"):
            continue
        module = MODULE_NAME.search(cells[0]).group(1)
        header = MODULE_NAME.search(cells[1])
        deps = cells[3]
        if "all of the above" in deps:
            listed = [r[0] for r in rows]
        else:
            listed = [d for d in re.findall(r"(?:pkg-[a-z]+|cmd(?:/[a-z]+)?)", deps)]
        rows.append((module, header.group(1) if header else None, listed))
    return rows


def module_of(path, modules):
    """The module owning repository-relative @path (longest prefix wins)."""
    best = None
    for m in modules:
        if path == m or path.startswith(m + "/"):
            if os.path.dirname(path) == m and (best is None or len(m) > len(best)):
                best = m
    return best


def main():
    failures = 0

    def report(ok, what):
        nonlocal failures
        print(("ok - " if ok else "not ok - ") + what)
        failures += not ok

    rows = read_table()
    order = {m: i for i, (m, _, _) in enumerate(rows)}
    header = {m: h for m, h, _ in rows}
    deps = {m: set(d) for m, _, d in rows}

    upward = [f"{m} depends on {d}, which is not above it"
              for m, _, listed in rows for d in listed
              if d not in order or order[d] >= order[m]]
    for u in upward:
        print("#   " + u)
    report(rows and not upward, f"layers: the {len(rows)} modules of the table "
           "depend only on modules above them")

    missing = [d for d in sorted(os.listdir(TOP)) if d.startswith("pkg-") and
               os.path.isdir(os.path.join(TOP, d)) and d not in order]
    report(not missing, "layers: every pkg-* directory has a row in the table" +
           (f" (missing: {', '.join(missing)})" if missing else ""))

    sources = []
    for root in ["cmd"] + [d for d in os.listdir(TOP) if d.startswith("pkg-")]:
        for dirpath, _, files in os.walk(os.path.join(TOP, root)):
            sources += [os.path.join(dirpath, f) for f in files
                        if f.endswith((".c", ".h"))]
    bad = []
    for src in sorted(sources):
        rel = os.path.relpath(src, TOP)
        own = module_of(rel, order)
        if own is None:
            bad.append(f"{rel}: in no module of the table")
            continue
        for inc in INCLUDE.findall(open(src, errors="replace").read()):
            target = os.path.relpath(os.path.normpath(
                os.path.join(os.path.dirname(src), inc)), TOP)
            other = module_of(target, order)
            if other == own:
                continue
            if other is None:
                bad.append(f'{rel}: includes "{inc}", outside every module')
            elif other not in deps[own]:
                bad.append(f'{rel}: includes "{inc}" but {own} does not '
                           f"depend on {other}")
            elif os.path.basename(target) != header[other]:
                bad.append(f'{rel}: includes "{inc}", a private header of '
                           f"{other} (its public one is {header[other]})")
    for b in bad:
        print("#   " + b)
    report(not bad, f"layers: {len(sources)} files include only public headers "
           "of the modules they depend on")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
