"""The Facts container: named values, each probed once on first use."""

from __future__ import annotations

import os
from pathlib import Path

from . import probes

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Callable, Iterable, Mapping

#: fact name -> the probe group that produces it (one probe call fills a group).
_GROUPS: dict[str, Callable[[Facts], Mapping[str, str | None]]] = {}


def _register(names: Iterable[str], probe: Callable[[Facts], Mapping[str, str | None]]) -> None:
    for name in names:
        _GROUPS[name] = probe


_register(probes.PYTHON_FACTS, lambda f: probes.python())
_register(probes.PLATFORM_FACTS, lambda f: probes.platform())
_register(probes.LIBSTDCXX_FACTS, lambda f: probes.libstdcxx(f.memo_dir))
_register(("compiler.cc",), lambda f: {"compiler.cc": probes.compiler("CC", "cc", f.memo_dir)})
_register(("compiler.cxx",), lambda f: {"compiler.cxx": probes.compiler("CXX", "c++", f.memo_dir)})
_register(probes.TORCH_FACTS, lambda f: probes.torch())
_register(probes.TRITON_FACTS, lambda f: probes.triton())
_register(probes.TVM_FFI_FACTS, lambda f: probes.tvm_ffi())
_register(("cuda.nvcc",), lambda f: {"cuda.nvcc": probes.nvcc(f.memo_dir)})
_register(probes.CUDA_FACTS, lambda f: _cuda(f.memo_dir))
_register(("hip.runtime",), lambda f: _hip())


def _cuda(memo_dir: Path | None) -> Mapping[str, str | None]:
    from . import cuda_probe  # only when a requirement or a key names a CUDA fact

    return cuda_probe.probe(memo_dir)


def _hip() -> Mapping[str, str | None]:
    from . import amd_probe  # only when a requirement names it

    return amd_probe.hip_runtime()

#: facts that name the tool a variable chooses: probed again when it changes in
#: this process ($CXX set between two builds), never served from another value's answer
_BOUND = {"compiler.cc": "CC", "compiler.cxx": "CXX"}

#: every fact name with a probe, in a stable order.
FACT_NAMES: tuple[str, ...] = tuple(_GROUPS)


class Facts:
    """Named environment facts; a missing fact is None.

    `values` are fixed facts that are never probed; `probe=False` makes every
    other fact None (a fully specified environment, e.g. a target machine).
    """

    def __init__(
        self,
        values: Mapping[str, str | None] | None = None,
        *,
        probe: bool = True,
        memo_dir: Path | None = None,
    ) -> None:
        self._values: dict[str, str | None] = dict(values or {})
        self._fixed = frozenset(self._values)
        self._bound: dict[tuple[str, str | None], str | None] = {}
        self._probe = probe
        self.memo_dir = memo_dir

    @classmethod
    def from_dict(cls, values: Mapping[str, str | None]) -> Facts:
        return cls(values, probe=False)

    def with_overrides(self, overrides: Mapping[str, str | None]) -> Facts:
        """A new Facts where `overrides` win and everything else is probed as here."""
        merged = Facts({**self._values, **overrides}, probe=self._probe, memo_dir=self.memo_dir)
        merged._fixed = self._fixed | frozenset(overrides)
        return merged

    def get(self, name: str) -> str | None:
        variable = _BOUND.get(name)
        if variable is not None and self._probe and name not in self._fixed:
            return self._bound_fact(name, variable)
        try:
            return self._values[name]
        except KeyError:
            pass
        group = _GROUPS.get(name)
        if not self._probe or group is None:
            return None
        for key, value in group(self).items():
            self._values.setdefault(key, value)
        return self._values.setdefault(name, None)

    def __getitem__(self, name: str) -> str | None:
        return self.get(name)

    def _bound_fact(self, name: str, variable: str) -> str | None:
        chosen = (name, os.environ.get(variable))
        try:
            value = self._bound[chosen]
        except KeyError:
            value = self._bound[chosen] = _GROUPS[name](self)[name]
        self._values[name] = value  # for snapshot()
        return value

    def snapshot(self) -> dict[str, str | None]:
        """Every fact known so far (probed or fixed), for a manifest."""
        return dict(sorted(self._values.items()))

    def probe_all(self) -> dict[str, str | None]:
        for name in FACT_NAMES:
            self.get(name)
        return self.snapshot()
