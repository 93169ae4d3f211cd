"""ABICACHE_DROPIN: route existing JIT callers through abicache with no code change.

    ABICACHE_DROPIN=torch          torch.utils.cpp_extension.load / load_inline
    ABICACHE_DROPIN=tvm_ffi        tvm_ffi.cpp.load / load_inline
    ABICACHE_DROPIN=torch,tvm_ffi  both (or "all", or "1")

The wheel puts abicache-dropin.pth in site-packages; Python runs its one line
at start-up, which imports this module only when the variable is set. Then
nothing is imported up front: a hook on the import system waits for the
target module and patches it the moment it has run (abicache.torch.install()
and the like), so `from torch.utils.cpp_extension import load_inline`,
written anywhere later, gets abicache's. Triton has its own variable:
TRITON_CACHE_MANAGER=abicache.triton:CacheManager.

A mistake here must never stop the interpreter: an unknown name is reported
once on stderr and ignored.
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    import importlib.machinery
    from types import ModuleType
    from typing import Any, Sequence

# Every Python process of a user who set ABICACHE_DROPIN imports this module at
# start-up, torch user or not: it imports nothing else (not typing, not
# importlib.abc; the hook classes below are duck-typed as the import system
# allows), and abicache's package imports nothing up front (__init__.py).

VARIABLE = "ABICACHE_DROPIN"
#: name in ABICACHE_DROPIN -> (the module patched, the abicache module whose install() patches it)
TARGETS = {
    "torch": ("torch.utils.cpp_extension", "abicache.torch"),
    "tvm_ffi": ("tvm_ffi.cpp", "abicache.tvm_ffi"),
}


def chosen(value: str) -> tuple[list[str], list[str]]:
    """(the frontends the variable names, the names it gives that are not frontends)."""
    names = [n.strip().lower().replace("-", "_") for n in value.split(",") if n.strip()]
    if any(n in ("1", "all", "yes", "true") for n in names):
        return list(TARGETS), [n for n in names if n not in TARGETS and n not in ("1", "all", "yes", "true")]
    if any(n in ("0", "no", "false", "off") for n in names):
        return [], []
    return [n for n in names if n in TARGETS], [n for n in names if n not in TARGETS]


def arm(value: str | None = None) -> None:
    """Patch each chosen module when it is imported (at once if it already is)."""
    import os

    frontends, unknown = chosen(os.environ.get(VARIABLE, "") if value is None else value)
    if unknown:
        print(f"abicache: {VARIABLE} names {', '.join(unknown)}, which abicache does not route; "
              f"use any of {', '.join(TARGETS)} (or all)", file=sys.stderr)
    for name in frontends:
        module, installer = TARGETS[name]
        if module in sys.modules:
            _install(installer)
        elif not any(isinstance(f, _AfterImport) and f.module == module for f in sys.meta_path):
            sys.meta_path.insert(0, _AfterImport(module, installer))


def disarm() -> None:
    """Remove the import hooks arm() set (modules already patched stay patched)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AfterImport)]


def _install(installer: str) -> None:
    import importlib

    try:
        importlib.import_module(installer).install()  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - the user's import goes on, unpatched, and says why
        print(f"abicache: {VARIABLE} could not route through {installer}: {exc}", file=sys.stderr)


class _AfterImport:  # an importlib.abc.MetaPathFinder
    """Finds nothing itself: asks the other finders for `module`, and wraps the
    loader they return so that `installer`.install() runs once it has executed."""

    def __init__(self, module: str, installer: str) -> None:
        self.module, self.installer = module, installer

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if fullname != self.module:
            return None
        others = [f for f in sys.meta_path if f is not self]
        spec = next((s for f in others if hasattr(f, "find_spec")
                     and (s := f.find_spec(fullname, path, target)) is not None), None)
        if spec is None or spec.loader is None:
            return spec
        sys.meta_path.remove(self)  # once: the hook has done its work
        spec.loader = _Patching(spec.loader, self.installer)
        return spec


class _Patching:  # an importlib.abc.Loader
    def __init__(self, loader: Any, installer: str) -> None:
        self.loader, self.installer = loader, installer

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        _install(self.installer)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, is_package: as the real loader
        return getattr(self.loader, name)
