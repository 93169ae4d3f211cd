"""One build of each stable op library a process: torch crashes (SIGSEGV in
torch.ops.load_library) when a second build of one STABLE_TORCH_LIBRARY namespace is
loaded into a process that has the first, so abicache.torch refuses it with the reason.
Imported only where a stable op library is loaded (torch.py _load).
"""

from __future__ import annotations

#: the stable op libraries loaded in this process: path -> extension name
_stable_loaded: dict[str, str] = {}
_stable_namespaces: dict[str, frozenset[str]] = {}  # path -> the namespaces it defines, once read
_STABLE_LIBRARY = rb"STABLE_TORCH_LIBRARY_static_init_(\w+)\x00"  # in .symtab (compiled by re once used)


def one_build(path: str, name: str) -> None:
    """torch crashes (SIGSEGV in torch.ops.load_library) when a second build of
    one STABLE_TORCH_LIBRARY namespace is loaded into a process that has the
    first: refuse it with the reason instead. A library's namespaces are read
    (the whole file) only once a second library comes: the first of a process,
    the common case, is loaded without reading it."""
    if path not in _stable_loaded and _stable_loaded:
        found = _namespaces_of(path, name)
        for loaded, other in _stable_loaded.items():
            for ns in sorted(found & _namespaces_of(loaded, other)):
                from ..errors import UsageError

                raise UsageError(f"the stable op library {ns!r} is already loaded in this process from {loaded}; "
                                 f"torch cannot load a second build of it ({path}) without crashing. Start a new "
                                 "process to use the new build, or give the new code another library name")
    _stable_loaded[path] = name


def _namespaces_of(path: str, name: str) -> frozenset[str]:
    """The namespaces a stable op library defines; a stripped one, or one whose entry was
    evicted since this process loaded it, is known by its extension name."""
    found = _stable_namespaces.get(path)
    if found is None:
        import re

        try:
            with open(path, "rb") as f:
                found = frozenset(n.decode() for n in re.findall(_STABLE_LIBRARY, f.read()))
        except OSError:
            found = frozenset()
        found = _stable_namespaces[path] = found or frozenset({f"({name})"})
    return found

