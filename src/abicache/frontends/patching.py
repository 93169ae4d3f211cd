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
        self._say_what_stays()

    def _say_what_stays(self) -> None:
        """Warn of each name bound to an original before install() (`from torch.utils.cpp_extension
        import load_inline`, then install()): calls through it are not routed, which patching
        the module cannot change; said rather than left silent."""
        import sys
        import warnings

        from ..errors import AbicacheWarning

        originals = {id(value): name for name, value in self.saved.items()}
        own = (self.module.split(".")[0] + ".", "abicache.")
        for module_name, module in list(sys.modules.items()):
            if module_name == self.module or module_name.startswith(own) or module is None:
                continue
            for bound, value in list(getattr(module, "__dict__", {}).items()):
                name = originals.get(id(value))
                if name is not None and value is self.saved[name]:
                    warnings.warn(f"abicache: {module_name}.{bound} is {self.module}.{name} as it was before "
                                  f"install(): calls through that name keep {self.module}'s own; import it after "
                                  f"install(), or call it as {self.module}.{name}", AbicacheWarning, stacklevel=4)

    def uninstall(self) -> None:
        if self.saved:
            target = importlib.import_module(self.module)
            for name, value in self.saved.items():
                setattr(target, name, value)
            self.saved = {}
