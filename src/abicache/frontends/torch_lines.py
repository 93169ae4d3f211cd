"""torch's own build lines, as the installed torch's cpp_extension writes them

into build.ninja, read from its source without importing torch (a second).

What differs between torch versions is taken from torch/utils/cpp_extension.py
itself, parsed once per install (memoized by the file's stat under the
store's tools/):

- the C++ standard of the C++ line (`cflags = common_cflags + ['-fPIC',
  '-std=c++NN'] + extra_cflags`);
- the standard nvcc gets when the caller gives none;
- COMMON_NVCC_FLAGS (the `-D__CUDA_NO_HALF_OPERATORS__` family and
  `--expt-relaxed-constexpr`);
- whether it defines `_GLIBCXX_USE_CXX11_ABI` (older torch does; 2.13 does not).

Where the file cannot be read or parsed, the values of the newest torch this
was checked against (2.13) are used. The rest of the structure (the order of
the groups of flags, `--compiler-options '-fPIC'`, `-ccbin $CC`, the link
line) is the same in the versions abicache supports; tests/test_torch_lines.py
compares every line with the build.ninja the installed torch writes.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..values.records import named_tuple

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Mapping

#: the memo of cpp_extension.py's lines under the store's tools/: what a hit record witnesses it by
LINES_MEMO = "cpp_extension build lines v1"


def files(named: Mapping[str, str | None]) -> list[tuple[str, str | None]]:
    """The files of this torch a lookup reads beyond its facts (hits/__init__.py torch_facts),
    each with the name of its memo under the store's tools/ (None: read, not memoized): a hit
    record witnesses them (hits/writer.py)."""
    import os

    root = named.get("torch.root") or ""
    return [(os.path.join(root, "utils", "cpp_extension.py"), LINES_MEMO),
            (os.path.join(root, "include", "torch", "csrc", "stable", "version.h"), None)]


_STD = r"-std=c\+\+\d+"
#: torch 2.13's values, for a file that cannot be read
NVCC_COMMON = ("-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
               "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__", "--expt-relaxed-constexpr")


@named_tuple
class TorchLines:
    cxx_std: str = "-std=c++20"
    nvcc_std: str = "-std=c++20"
    nvcc_common: tuple[str, ...] = NVCC_COMMON
    abi_define: bool = False


def lines(torch_root: Path, memo_dir: Path | None) -> TorchLines:
    """The installed torch's (torch_root: the torch package folder)."""
    from ..env import toolid

    source = torch_root / "utils" / "cpp_extension.py"
    text = toolid.memoized(source, LINES_MEMO, _parsed, memo_dir)
    if text is None:
        return TorchLines()
    try:
        doc = json.loads(text)
        return TorchLines(doc["cxx_std"], doc["nvcc_std"], tuple(doc["nvcc_common"]), bool(doc["abi_define"]))
    except (ValueError, KeyError, TypeError):
        return TorchLines()


def _parsed(path: Path) -> str:
    import ast

    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (OSError, SyntaxError, ValueError):
        return json.dumps(TorchLines()._asdict())
    found = TorchLines()._asdict()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "COMMON_NVCC_FLAGS" for t in node.targets):
            try:
                found["nvcc_common"] = [str(f) for f in ast.literal_eval(node.value)]
            except ValueError:
                pass
        if isinstance(node, ast.FunctionDef) and node.name == "_write_ninja_file_to_build_library":
            found.update(_standards(node))
            body = (ast.get_source_segment(text, node) or "").lower()
            found["abi_define"] = "_glibcxx_use_cxx11_abi" in body or "glibcxx_abi_build_flags" in body
    return json.dumps(found)


def _standards(function: object) -> dict[str, str]:
    """The C++ line's standard (the list that holds '-fPIC'), and nvcc's default
    (the most common -std= of the rest)."""
    import ast
    from collections import Counter

    out: dict[str, str] = {}
    others: Counter[str] = Counter()
    for node in ast.walk(function):  # type: ignore[arg-type]
        if isinstance(node, ast.List):
            words = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            stds = [w for w in words if re.fullmatch(_STD, w)]
            if "-fPIC" in words and stds:
                out["cxx_std"] = stds[0]
                continue
            others.update(stds)
        elif isinstance(node, ast.Call):
            others.update(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                          and re.fullmatch(_STD, a.value))
    if others:
        out["nvcc_std"] = others.most_common(1)[0][0]
    elif "cxx_std" in out:
        out["nvcc_std"] = out["cxx_std"]
    return out
