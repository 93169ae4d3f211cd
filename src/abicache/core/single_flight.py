"""One build per key: under the key's local lock, and with a remote, the fleet's build lease
(remote/lease.py); another process's or machine's entry is taken instead where it comes.
A mixin of cache.Cache."""

from __future__ import annotations

import itertools

from .artifact import Artifact
from ..errors import ManifestError

TYPE_CHECKING = False  # typing is not imported at run time: a hit does not pay for it
if TYPE_CHECKING:
    from typing import Any, Callable

#: waits for the fleet's lease before a miss builds without one (the lease changed hands each time)
_FLEET_ROUNDS = 3


class SingleFlight:
    """Misses of cache.Cache: it has store, remote, lock_timeout."""

    store: Any
    remote: Any
    lock_timeout: float

    def _miss(self, kind: str, name: str, key: str, local: Callable[[], Artifact | None],
              here: Callable[[], Artifact | None], make: Callable[[], Artifact]) -> Artifact:
        """here() (this store, then the remote) once another process or machine has it,
        else make() under the key's local lock and, with a remote, the fleet's lease."""
        from ..console import progress
        from ..store.lock import key_lock  # only on a miss

        lock = self.store.layout.lock_file(key)
        self.store.make_dir(lock.parent)
        locked = lambda: key_lock(lock, f"{kind} {name}", self.lock_timeout, progress.note,  # noqa: E731
                                  self.store.trust.file_mode)
        fleet = self._fleet()
        if fleet is None:
            with locked():
                return here() or make()  # another process may have built it meanwhile
        what, known = f"{kind} {name}", self._known_seconds(kind, name)
        machine = fleet.machine_id(str(self.store.root))
        for _ in range(_FLEET_ROUNDS):
            # Another machine may be building it: wait for its upload holding no local
            # lock, so this machine's other processes wait beside us, not behind us.
            outcome = fleet.wait(self.remote, kind, key, what, here, known, self.lock_timeout, progress.note,
                                 machine)
            if outcome.found is not None:
                return outcome.found  # type: ignore[no-any-return]
            with locked():  # the remote was looked at just now (the wait), and is again once the lease is ours
                found = local() or fleet.build(self.remote, kind, key, what, here, make, outcome, known, machine)
            if found is not None:
                return found  # type: ignore[no-any-return]
        with locked():
            return here() or make()  # the lease changed hands every round: build without one

    def _lookups(self) -> Any:
        """One miss's remote lookups share their bounds (replicate.Lookups); None without a remote."""
        if self.remote is None or self.remote.down:
            return None
        from ..shipping.replicate import Lookups

        return Lookups(self.remote.settings.lookup_bytes, self.remote.settings.max_variants)

    def _fleet(self) -> Any:
        """remote/lease.py where this cache has a remote up and leases on, else None."""
        if self.remote is None or self.remote.down or self.remote.settings.lease <= 0:
            return None
        from ..remote import lease

        return lease

    def _known_seconds(self, kind: str, name: str) -> float:
        """How long this name took to build here last (any key): it bounds how long
        a machine waits for another's build of it (remote/lease.py)."""
        seconds = 0.0
        for vdir in itertools.islice(self.store.iter_name_variants(kind, name), 8):
            try:
                seconds = max(seconds, self.store.read_manifest(vdir).build_seconds or 0.0)
            except (OSError, ManifestError):
                continue
        return seconds
