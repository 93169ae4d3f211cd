"""Who may write a file that abicache trusts: the owners and write bits one policy allows.

Private (the default): the user alone (and root); nothing writable by anyone else.
Shared (ABICACHE_SHARED=<group>): also the members of that named group, which alone may
have write access, never others. A read-only store (a wheel's, installed by pip under
umask 002) may also be writable by its owner's private group (a group of the owner's
own name with no other member), which lets nobody else write it. A store applies it to everything a hit uses
(store/trust.py); the settings rule to the config files (setting_sources.py). Checks
take lstat results: a symbolic link is never trusted.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import ConfigError

_POSIX = hasattr(os, "geteuid")


class Trust:
    """The policy of one store: which owners and which write bits are allowed."""

    def __init__(self, group: str | None = None, *, private_groups: bool = False) -> None:
        self.group = group or None
        self.me = os.geteuid() if _POSIX else -1
        self.gid = _group_id(self.group) if self.group and _POSIX else None
        self._members: dict[int, bool] = {self.me: True, 0: True}
        self._private_groups = private_groups
        self._private: dict[tuple[int, int], bool] = {}

    @property
    def shared(self) -> bool:
        return self.gid is not None

    @property
    def dir_mode(self) -> int:
        return 0o2770 if self.shared else 0o700

    @property
    def file_mode(self) -> int:
        """Small writable files of the store (locks, logs, index markers)."""
        return 0o660 if self.shared else 0o600

    # ---- owners ------------------------------------------------------------------

    def trusted_owner(self, uid: int) -> bool:
        known = self._members.get(uid)
        if known is None:
            known = self._members[uid] = self.shared and _is_member(uid, self.gid or 0, self.group or "")
        return known

    def ok(self, st: os.stat_result) -> bool:
        """problem() is None, without building a message (the hit path)."""
        if not _POSIX:
            return True
        mode = st.st_mode
        if mode & stat.S_IWOTH or stat.S_ISLNK(mode):
            return False
        if mode & stat.S_IWGRP and (self.gid is None or st.st_gid != self.gid) and not self._own_group(st):
            return False
        return st.st_uid == self.me or st.st_uid == 0 or self.trusted_owner(st.st_uid)

    def _own_group(self, st: os.stat_result) -> bool:
        """Group write where that is allowed, by the owner's private group (nobody else's)."""
        if not self._private_groups:
            return False
        memo = (st.st_uid, st.st_gid)
        known = self._private.get(memo)
        if known is None:
            known = self._private[memo] = private_group(st.st_uid, st.st_gid)
        return known

    def problem(self, st: os.stat_result, what: str) -> str | None:
        """Why this (lstat) result may not be trusted, or None."""
        if not _POSIX:
            return None  # Windows: ACLs, not mode bits; nothing portable to check
        if stat.S_ISLNK(st.st_mode):
            return f"{what} is a symbolic link"
        if not self.trusted_owner(st.st_uid):
            return f"{what} is owned by uid {st.st_uid}, {self._who()}"
        if st.st_mode & stat.S_IWOTH:
            return f"{what} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
        if st.st_mode & stat.S_IWGRP and not (self.shared and st.st_gid == self.gid) and not self._own_group(st):
            return f"{what} is writable by group {st.st_gid} (mode {stat.S_IMODE(st.st_mode):o})"
        return None

    def _who(self) -> str:
        if self.shared:
            return f"who is neither you (uid {self.me}), root, nor a member of group {self.group!r}"
        return f"not you (uid {self.me}) or root"

    # ---- making folders ------------------------------------------------------------

    def make_dir(self, path: Path) -> None:
        """Create path (and missing parents up to an existing folder) with this
        policy's mode, whatever the umask."""
        missing = []
        for folder in [path, *path.parents]:
            if os.path.isdir(folder):
                break
            missing.append(folder)
        for folder in reversed(missing):
            try:
                os.mkdir(folder, self.dir_mode)
            except FileExistsError:
                continue  # made by another process: checked where it is used
            self.fix_dir(folder)

    def fix_dir(self, path: Path) -> None:
        """Give a folder of ours this policy's mode (and group)."""
        if not _POSIX:
            return
        if self.shared:
            os.chown(path, -1, self.gid or 0)
        os.chmod(path, self.dir_mode)


def _group_id(group: str) -> int:
    import grp

    try:
        return grp.getgrgid(int(group)).gr_gid if group.isdigit() else grp.getgrnam(group).gr_gid
    except (KeyError, ValueError):
        raise ConfigError(
            f"ABICACHE_SHARED={group!r} is not a group on this machine; name the group whose members "
            "may write the shared cache (see `getent group`), or unset it for a private cache"
        ) from None


def _is_member(uid: int, gid: int, group: str) -> bool:
    import grp
    import pwd

    try:
        user = pwd.getpwuid(uid)
    except KeyError:
        return False  # a uid with no user: nobody vouched for it
    if user.pw_gid == gid:
        return True
    try:
        return user.pw_name in grp.getgrgid(gid).gr_mem
    except KeyError:
        return False


def group_setting(raw: str | bool | None) -> str | None:
    """ABICACHE_SHARED (or Cache(shared=...)) as a group name, or None for private."""
    if raw is None or raw is False:
        return None
    text = str(raw).strip()
    if text.lower() in ("", "0", "false", "no", "off"):
        return None
    if raw is True or text.lower() in ("1", "true", "yes", "on"):
        raise ConfigError(
            "ABICACHE_SHARED must name the group whose members may write the shared cache "
            "(for example ABICACHE_SHARED=ml-team); '1' no longer means 'trust whoever owns the root'"
        )
    return text


def private_group(uid: int, gid: int) -> bool:
    """gid is uid's own private group: its primary group, named as the user, with no
    other member (the group each user gets on most Linux systems, where umask 002 is usual)."""
    import grp
    import pwd

    try:
        user, group = pwd.getpwuid(uid), grp.getgrgid(gid)
    except KeyError:
        return False
    return user.pw_gid == gid and group.gr_name == user.pw_name and set(group.gr_mem) <= {user.pw_name}


def quoted(path: Path) -> str:
    """A path as a shell command line may hold it (a fix we print): a name can hold ~, $ or spaces."""
    import shlex

    return shlex.quote(str(path))
