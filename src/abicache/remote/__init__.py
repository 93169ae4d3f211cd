"""The remote tier: a store shared by a fleet (S3-compatible object storage or Redis).

Clients (obstore, redis-py) and cryptography are imported only when a remote
is configured and a local miss reaches it.
"""

from __future__ import annotations

from .tier import RemoteSettings, Tier, reset, tier_for
from .url import RemoteURL

__all__ = ["RemoteSettings", "RemoteURL", "Tier", "reset", "tier_for"]
