"""The local store: versioned layout, atomic publish, verification, eviction.

Its names are resolved at first use: a hit its record serves (hits/) imports the in-process
watch (watch.py) on its second call, and none of the store."""

__all__ = ["FileRecord", "Layout", "Manifest", "Store"]

_WHERE = {"Layout": "layout", "Store": "local", "FileRecord": "manifest", "Manifest": "manifest"}


def __getattr__(name: str) -> object:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import sys

    __import__(f"{__name__}.{module}")
    value = getattr(sys.modules[f"{__name__}.{module}"], name)
    globals()[name] = value
    return value
