"""abicache: build, cache and load compiled native and GPU artifacts.

Nothing incompatible is ever loaded and nothing compatible is ever rebuilt:
every entry is keyed by what was built and carries the requirements under
which it may be loaded, checked against the live environment on every lookup.

    import abicache
    lib = abicache.cc.load_library("add", ['extern "C" int add(int a, int b) { return a + b; }'])

Importing abicache is light: frontends (cc, torch, cuda, triton) and heavy
dependencies load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._version import __version__

if TYPE_CHECKING:
    from .cache import Artifact, Cache, get_or_build
    from .env import Facts
    from .errors import AbicacheError
    from .key import Inputs
    from .requirements import Requirement, Requirements

__all__ = [
    "AbicacheError",
    "Artifact",
    "Cache",
    "Facts",
    "Inputs",
    "Requirement",
    "Requirements",
    "__version__",
    "cc",
    "get_or_build",
]

_LAZY = {
    "Artifact": ("cache", "Artifact"),
    "Cache": ("cache", "Cache"),
    "get_or_build": ("cache", "get_or_build"),
    "Facts": ("env", "Facts"),
    "AbicacheError": ("errors", "AbicacheError"),
    "Inputs": ("key", "Inputs"),
    "Requirement": ("requirements", "Requirement"),
    "Requirements": ("requirements", "Requirements"),
}
_SUBMODULES = {"cc", "cache", "env", "store", "audit", "requirements", "key", "cli", "config"}


def __getattr__(name: str) -> Any:
    import importlib

    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(f".{module}", __name__), attr)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module 'abicache' has no attribute {name!r}")
    globals()[name] = value
    return value
