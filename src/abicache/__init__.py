"""abicache: build, cache and load compiled native and GPU artifacts.

Nothing incompatible is ever loaded and nothing compatible is ever rebuilt:
every entry is keyed by what was built and carries the requirements under
which it may be loaded, checked against the live environment on every lookup.

    import abicache
    lib = abicache.cc.load_library("add", ['extern "C" int add(int a, int b) { return a + b; }'])

Importing abicache loads the cache-hit path and nothing heavy: the compiler
drivers, the ELF reader, rich, torch, triton and remote clients load only
when a miss, an audit, the CLI or a frontend needs them.
"""

# No `from __future__ import annotations` here: it would put `annotations` in dir(abicache).
from . import cc
from ._version import __version__
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
