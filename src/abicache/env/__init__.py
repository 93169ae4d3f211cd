"""Facts about the running environment, probed lazily and memoized.

    from abicache.env import Facts
    facts = Facts()                       # probes on first use of each fact
    facts.get("python.abi")               # 'cp311'
    Facts.from_dict({"python.abi": "cp312"})   # no probing: tests, cross builds

No probe imports torch, triton or a CUDA library.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .facts import FACT_NAMES, Facts

__all__ = ["FACT_NAMES", "Facts"]


def __getattr__(name: str) -> object:
    """Facts and FACT_NAMES, imported at first use: a hit that reads one light module of
    this package (cuda_premise.py, in a served call of GPU code) imports no probe."""
    if name in __all__:
        from . import facts

        return getattr(facts, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
