"""abicache: build, cache and load compiled native and GPU artifacts.

Nothing incompatible is ever loaded and nothing compatible is ever rebuilt:
every entry is keyed by what was built and carries the requirements under
which it may be loaded, checked against the live environment on every lookup.

    import abicache
    lib = abicache.cc.load_library("add", ['extern "C" int add(int a, int b) { return a + b; }'])

Importing abicache loads nothing but its version: each name below is imported
the first time it is used (PEP 562), so `import abicache.dropin` at every
interpreter start (ABICACHE_DROPIN) and `import abicache.triton` cost only
what they use. The hit path then loads the cache and nothing heavy: the
compiler drivers, the ELF reader, rich, torch, triton and remote clients load
only when a miss, an audit, the CLI or a frontend needs them.
"""

# No `from __future__ import annotations` here: it would put `annotations` in dir(abicache).

# Here, not in a module of its own: a torch extension's hit imports this package anyway, and each
# module more costs it ~0.1 ms (issue 49). pyproject.toml says the same (tests/test_public_names.py).
__version__ = "0.1.0"

#: public name -> the module that defines it
_LAZY = {
    "AbicacheError": "abicache.errors",
    "Artifact": "abicache.core.cache",
    "Cache": "abicache.core.cache",
    "Facts": "abicache.env",
    "Inputs": "abicache.core.key",
    "Requirement": "abicache.values.requirements",
    "Requirements": "abicache.values.requirements",
    "get_or_build": "abicache.core.cache",
}

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


def __getattr__(name: str) -> object:
    # __import__, not importlib.import_module: importing importlib (and warnings) costs a
    # fresh process about 1 ms
    import sys as _sys

    if name == "cc":
        __import__("abicache.cc")
        return _sys.modules["abicache.cc"]
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module 'abicache' has no attribute {name!r}")
    __import__(where)
    value = getattr(_sys.modules[where], name)
    globals()[name] = value  # once: later uses are plain lookups
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
