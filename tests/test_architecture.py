"""ARCHITECTURE.md is kept true: every path and module it names exists, every name it
gives in backticks with a dot (`config.VARIABLES`) is there; the README links it and
names no path outside the repository."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAP = ROOT / "ARCHITECTURE.md"
PACKAGE = ROOT / "src" / "abicache"


def _quoted() -> list[str]:
    return re.findall(r"`([^`\s]+)`", MAP.read_text())


REPO_FOLDERS = ("src/", "tests/", "docs/", "bench/", "scripts/")


def _is_path(text: str) -> bool:
    """A path of the repository (the on-disk layout's folders, `tmp/`, `entries/<kind>/...`, are not)."""
    return re.fullmatch(r"[\w./-]+", text) is not None and (
        text.startswith(REPO_FOLDERS) or text.endswith((".py", ".md", ".c")))


def test_every_path_it_names_exists() -> None:
    named = [t for t in _quoted() if _is_path(t)]
    missing = []
    for text in named:
        candidates = [ROOT / text, PACKAGE / text, PACKAGE.parent / text]
        if not any(p.exists() for p in candidates) and not ("/" not in text and _module_file(text)):
            missing.append(text)
    assert len(named) > 40 and missing == [], missing


def _code_map() -> str:
    section = MAP.read_text().split("## Code map", 1)[1].split("## Invariants", 1)[0]
    return "\n".join(line for line in section.splitlines() if line.startswith("|"))


def _module_file(name: str) -> list[Path]:
    """`store/lock.py` or `cli/`: that path; a bare `cache.py`: wherever the package holds it."""
    if "/" in name:
        return [PACKAGE / name] if (PACKAGE / name).exists() else []
    return sorted(PACKAGE.rglob(name))


def test_every_module_file_in_the_code_map_exists() -> None:
    named = re.findall(r"`([\w/]+(?:\.py|/))`", _code_map())
    missing = [n for n in named if not _module_file(n)]
    assert len(named) > 40 and missing == [], missing


#: folders whose every module the code map lists by name (the others are described as a whole)
LISTED_FOLDERS = ("values", "settings", "native", "console", "shipping", "core", "frontends")


def test_every_module_of_the_listed_folders_is_in_the_code_map() -> None:
    mapped = set(re.findall(r"`([\w/]+\.py)`", _code_map()))
    unlisted = [f"{folder}/{p.name}" for folder in LISTED_FOLDERS for p in sorted((PACKAGE / folder).glob("*.py"))
                if p.name != "__init__.py" and p.name not in mapped]
    assert unlisted == []


def test_every_top_level_module_is_in_the_code_map() -> None:
    mapped = set(re.findall(r"`([\w/]+(?:\.py|/))`", _code_map()))
    modules = {p.name for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__")}
    folders = {f"{p.name}/" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert sorted((modules | folders) - mapped) == []


def _module_named(name: str) -> str | None:
    """The dotted module a short name means: `config` is abicache.settings.config (one file of that name)."""
    found = sorted(PACKAGE.rglob(f"{name}.py"))
    if len(found) != 1:
        return None
    return ".".join(("abicache", *found[0].relative_to(PACKAGE).with_suffix("").parts))


def test_every_dotted_name_it_gives_exists() -> None:
    """`config.VARIABLES`, `key.Inputs`: a module of the package and a name in it."""
    dotted = [t for t in _quoted() if re.fullmatch(r"[a-z_]+\.[A-Za-z_]+", t) and t.split(".")[1] not in ("py", "md", "c")
              and _module_named(t.split(".")[0])]
    missing = [t for t in dotted if not hasattr(importlib.import_module(_module_named(t.split(".")[0]) or ""),
                                                t.split(".")[1])]
    assert len(dotted) >= 3 and missing == [], missing


def test_the_readme_links_the_map_and_names_nothing_outside_the_repository() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "ARCHITECTURE.md" in readme
    assert re.findall(r"\.\./[\w./-]+", readme) == []
