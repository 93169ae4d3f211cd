from __future__ import annotations

from ..errors import AbicacheError


class AuditError(AbicacheError):
    """A file could not be audited: not a binary we know, truncated, or malformed."""
