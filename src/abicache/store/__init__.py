"""The local store: versioned layout, atomic publish, verification, eviction."""

from .layout import Layout
from .local import Store
from .manifest import FileRecord, Manifest

__all__ = ["FileRecord", "Layout", "Manifest", "Store"]
