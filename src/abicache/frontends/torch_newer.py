"""A call of abicache.torch's load or load_inline with a parameter of a newer torch than
abicache knows: handed to torch's own function (uncached), with one warning naming it.

Every torch release may add a parameter, and the drop-in must not turn it into a TypeError
in someone's program. Here, not in torch.py: a torch extension's hit imports that module
and runs none of this (issue 49: each kilobyte of bytecode loaded costs a hit ~10 us).
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing is not imported at run time
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping


#: abicache's own keywords of load and load_inline, which torch's functions do not take
_OURS = ("stable", "target", "cache", "newer")


def call(function: str, mine: Callable[..., Any], saved: Callable[..., Any] | None, given: Mapping[str, Any],
         newer: Mapping[str, Any], **ours: Any) -> Any:
    """The call, handed to torch's own function (module docstring). The arguments given
    are passed on as keywords, those left at torch's defaults not at all (an older torch may
    lack them); a parameter torch does not know either is torch's own TypeError. mine: abicache's
    function of that name; saved: torch's own, as install() saved it (None: not installed)."""
    import importlib
    import inspect

    from ..errors import UsageError, warn_once

    if any(value is not None and value is not False for value in ours.values()):
        named = ", ".join(f"{k}=" for k, v in ours.items() if v is not None and v is not False)
        raise UsageError(f"abicache.torch.{function}: {', '.join(sorted(newer))} is not a parameter abicache "
                         f"knows, and torch's own {function} takes no {named}: drop one or the other")
    defaults = {p.name: p.default for p in inspect.signature(mine).parameters.values()}
    passed = {k: v for k, v in given.items() if k not in _OURS and k in defaults and v is not defaults[k]}
    original = saved or getattr(importlib.import_module("torch.utils.cpp_extension"), function)
    if original is mine:
        raise UsageError(f"abicache.torch.{function}: torch's own {function} cannot be found (it was replaced)")
    warn_once(f"abicache.torch.{function}: {', '.join(sorted(newer))} is a parameter of a newer torch than "
              f"abicache knows; this call runs torch's own {function}, uncached (upgrade abicache to cache it)")
    return original(**passed, **newer)

