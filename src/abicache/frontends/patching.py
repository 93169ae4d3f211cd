"""Route a library's entry points through abicache in this process, and back
(abicache.torch.install(), abicache.tvm_ffi.install())."""

from __future__ import annotations

import importlib
from typing import Any


class Patch:
    """Replacements for some attributes of one module; install() is idempotent and
    uninstall() restores the originals. Callers that imported a name before
    install() keep the original: the module attribute is what changes."""

    def __init__(self, module: str, **replacements: Any) -> None:
        self.module = module
        self.replacements = replacements
        self.saved: dict[str, Any] = {}

    def install(self) -> None:
        target = importlib.import_module(self.module)
        if not self.saved:
            self.saved = {name: getattr(target, name) for name in self.replacements}
        for name, value in self.replacements.items():
            setattr(target, name, value)

    def uninstall(self) -> None:
        if self.saved:
            target = importlib.import_module(self.module)
            for name, value in self.saved.items():
                setattr(target, name, value)
            self.saved = {}
