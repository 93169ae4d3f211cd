r"""Make-style dependency files, as gcc, clang and nvcc write them with -MD -MF.

    out.o: src/a.cpp /usr/include/stdio.h \
      include/my\ header.h

Each logical line (a backslash before a newline continues it) is one rule,
'targets: prerequisites'. Words are split on unescaped white space, with
'\ ' an escaped space, '\<tab>' an escaped tab, '\#' a '#' and '$$' a '$'. The ':' that ends the
targets is followed by white space or the end of the line, so 'C:\x' is a
path, not a rule. Phony rules (-MP's 'header.h:') have no prerequisites.
"""

from __future__ import annotations

import re
from pathlib import Path


def parse(text: str) -> list[str]:
    """Every prerequisite of every rule, in order, without duplicates."""
    joined = text.replace("\\\r\n", " ").replace("\\\n", " ")
    out: list[str] = []
    seen = set()
    for line in joined.splitlines():
        for word in _prerequisites(line):
            if word not in seen:
                seen.add(word)
                out.append(word)
    return out


_RULE = re.compile(r":(?=[ \t]|$)")
_BLANKS = re.compile(r"[ \t]+")


def _prerequisites(line: str) -> list[str]:
    if "\\" not in line and "$" not in line:  # nothing escaped (the common case): split on blanks
        colon = _RULE.search(line)
        return [w for w in _BLANKS.split(line[colon.end():]) if w] if colon else []
    return _escaped(line)


def _escaped(line: str) -> list[str]:
    words: list[str] = []
    current: list[str] = []
    after_colon = False
    i = 0
    while i < len(line):
        c = line[i]
        if c == "\\" and line[i + 1:i + 2] in (" ", "\t", "#", "\\"):
            current.append(line[i + 1])
            i += 2
            continue
        if c == "$" and line[i + 1:i + 2] == "$":
            current.append("$")
            i += 2
            continue
        if c in " \t":
            if current and after_colon:
                words.append("".join(current))
            current = []
        elif c == ":" and not after_colon and line[i + 1:i + 2] in ("", " ", "\t"):
            after_colon = True
            current = []
        else:
            current.append(c)
        i += 1
    if current and after_colon:
        words.append("".join(current))
    return words


def read(path: Path) -> list[str]:
    return parse(path.read_text(errors="surrogateescape"))
