"""Importing a CPython extension module from its file, as a cached build is imported."""

from __future__ import annotations

import os

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from types import ModuleType

#: module name -> the files imported under it in this process, in order
_imported: dict[str, list[str]] = {}


def import_extension(name: str, path: str | os.PathLike[str]) -> ModuleType:
    """Import the extension module at path. CPython keeps one module per name
    (a second file with the same PyInit_<name> gets the first module back), so
    a new build under a name already imported in this process (new code, or a
    header edit) is imported as `<name>_v<N>.<name>`: the init symbol is found,
    the module is new, the way cpp_extension's name_v1 is (without a rebuild).
    The first import under a name is also sys.modules[name]."""
    import importlib.machinery
    import sys
    # importlib.util's own module_from_spec, without the 3 ms importlib.util imports
    from importlib._bootstrap import module_from_spec

    seen = _imported.setdefault(name, [])
    key = os.fspath(path)
    if key not in seen:
        seen.append(key)
    version = seen.index(key)
    full = name if version == 0 else f"{name}_v{version}.{name}"
    loader = importlib.machinery.ExtensionFileLoader(full, key)
    spec = importlib.machinery.ModuleSpec(full, loader, origin=key)
    spec.has_location = True  # as spec_from_file_location makes it: the module's __file__ is its path
    module = module_from_spec(spec)
    loader.exec_module(module)
    sys.modules[full] = module
    return module
