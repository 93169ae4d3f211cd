"""Facts about the running environment, probed lazily and memoized.

    from abicache.env import Facts
    facts = Facts()                       # probes on first use of each fact
    facts.get("python.abi")               # 'cp311'
    Facts.from_dict({"python.abi": "cp312"})   # no probing: tests, cross builds

No probe imports torch, triton or a CUDA library.
"""

from .facts import FACT_NAMES, Facts

__all__ = ["FACT_NAMES", "Facts"]
