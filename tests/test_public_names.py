"""Every name the documentation tells users to import resolves, and the top of the package
holds only what users import.

The inner modules live in folders named for what they own (ARCHITECTURE.md's code map); a
move among them must never change a documented import. The names are read from the docs
themselves (README.md, ARCHITECTURE.md, docs/), so a newly documented name is checked
the day it is written; docs/benchmarks.md is left out: it is the history of runs, naming
modules as they were then.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

import abicache

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "src" / "abicache"

#: what users import from the top of the package: the frontends, the errors, the drop-in
#: hook the wheel's .pth imports, the HIP loader, and the command line
PUBLIC = {"__init__", "__main__", "cc", "torch", "triton", "tvm_ffi", "cuda", "hip", "errors",
          "dropin", "cli"}
#: the inner rooms (ARCHITECTURE.md): each a folder, none imported by users
INNER = {"values", "settings", "native", "console", "env", "audit", "store", "remote", "shipping", "core",
         "engine", "frontends", "hits", "launcher"}
#: dotted words in the docs that are not Python names: a file, an entry-point group
NOT_PYTHON = {"abicache.toml", "abicache.stores"}
DOTTED = re.compile(r"(?<![\w./-])abicache(?:\.[A-Za-z_]\w*)+")


def _docs() -> list[Path]:
    found = [REPO / "README.md", REPO / "ARCHITECTURE.md", *sorted((REPO / "docs").rglob("*.md"))]
    return [p for p in found if p.name != "benchmarks.md"]


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def documented_imports() -> set[tuple[str, str | None]]:
    """(module, name or None) for every import statement in the docs' Python blocks."""
    found: set[tuple[str, str | None]] = set()
    for path in _docs():
        for block in _python_blocks(path.read_text()):
            try:
                tree = ast.parse(block)
            except SyntaxError:
                continue  # a fragment; test_docs_blocks runs the whole ones
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    found |= {(a.name, None) for a in node.names if a.name.split(".")[0] == "abicache"}
                elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "abicache":
                    found |= {(node.module, a.name) for a in node.names}
    return found


def documented_dotted() -> set[str]:
    """Every `abicache.x.y` the docs name in their prose or code."""
    names = {m for p in _docs() for m in DOTTED.findall(p.read_text())}
    return {n.rstrip(".") for n in names} - NOT_PYTHON


def resolve(dotted: str) -> object:
    """Import the longest module prefix of `dotted`, then follow the rest as attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as exc:
            if exc.name is not None and not ".".join(parts[:cut]).startswith(exc.name):
                raise  # a dependency of the module is missing, not the module
            continue
        for attr in parts[cut:]:
            value = getattr(value, attr)
        return value
    raise ModuleNotFoundError(dotted)


def test_the_docs_name_imports_and_dotted_names() -> None:
    # the reader below finds what the docs say: if it found nothing, every check here would pass
    assert ("abicache", "cuda") in documented_imports()
    assert {"abicache.cc.load_library", "abicache.torch.load_inline", "abicache.errors.BuildError",
            "abicache.cuda.program_cache.ProgramCache"} <= documented_dotted()


@pytest.mark.parametrize("module,name", sorted(documented_imports(), key=str))
def test_each_documented_import_resolves(module: str, name: str | None) -> None:
    # the statement itself, as a reader runs it (`from abicache import cuda` imports a submodule)
    scope: dict[str, object] = {}
    exec(f"import {module}" if name is None else f"from {module} import {name}", scope)
    assert scope


@pytest.mark.parametrize("dotted", sorted(documented_dotted()))
def test_each_documented_dotted_name_resolves(dotted: str) -> None:
    assert resolve(dotted) is not None


@pytest.mark.parametrize("name", sorted(abicache.__all__))
def test_each_top_level_name_resolves(name: str) -> None:
    assert getattr(abicache, name) is not None


def test_the_resolver_fails_on_a_name_that_is_not_there() -> None:
    with pytest.raises(AttributeError):
        resolve("abicache.cc.no_such_function")
    with pytest.raises(ModuleNotFoundError):
        resolve("no_such_package.x")


def test_the_top_holds_only_what_users_import() -> None:
    top = {p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir()
                                                     if (p / "__init__.py").is_file()}
    assert top - PUBLIC - INNER == set(), "a new top-level module: public (PUBLIC) or in a folder (INNER)?"
    assert {p.stem for p in PACKAGE.glob("*.py")} <= PUBLIC, "an inner module at the top: move it into its folder"
    assert INNER <= top, "an inner folder named here is gone: update INNER and ARCHITECTURE.md"


def test_the_version_is_the_one_pyproject_says() -> None:
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib
    with open(REPO / "pyproject.toml", "rb") as f:
        assert abicache.__version__ == tomllib.load(f)["project"]["version"]
