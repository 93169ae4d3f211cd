"""bench/faults.py's rows for what a neighbour can steer (issue: trust, third round): each
row replays one finding's real scenario (the same code as its test in
tests/test_neighbours.py and tests/test_lease.py: real users, servers, compilers) for
a number of trials and counts each trial whose promise broke in the column that names
it: planted code that ran, hangs past the timeout, entries lost to a prune, builds
refused after the fix, files written outside the store, background checks over the
cap, stale libraries served. Every count must be 0.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Callable

import pytest

import hostile
import servers

#: a failed trial, by the column it counts in
Outcome = Callable[[Path], None]


def _trials(row: Any, column: str, trials: int, scenario: Callable[[Path, pytest.MonkeyPatch], None]) -> None:
    """Run the scenario `trials` times in fresh folders, counting broken promises in `column`
    (a time-out counts as a hang wherever it happens: nothing may wait past its bound)."""
    from abicache.settings import settings_file
    from abicache.shipping import tiers

    for _ in range(trials):
        work = Path(tempfile.mkdtemp(prefix="abicache-neighbours-"))
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("ABICACHE_DIR", str(work / "default-root"))
            mp.setenv("XDG_CONFIG_HOME", str(work / "config-home"))
            settings_file.forget()
            tiers.forget()
            row.trials += 1
            row.faults += 1
            try:
                scenario(work, mp)
            except (subprocess.TimeoutExpired, TimeoutError):
                row.hangs += 1
            except (AssertionError, pytest.fail.Exception) as exc:  # an assert, or pytest.raises unmet
                setattr(row, column, getattr(row, column) + 1)
                row.note = f"{column}: {(str(exc).splitlines() or [type(exc).__name__])[0][:120]}"
            finally:
                settings_file.forget()
                hostile.cleanup()


def _call(test: Callable[..., None], **fixtures: Any) -> Callable[[Path, pytest.MonkeyPatch], None]:
    """A test function of the suite as a scenario (tmp_path, monkeypatch and capsys given here,
    its parameters by name)."""
    import inspect

    wanted = inspect.signature(test).parameters

    def run(work: Path, mp: pytest.MonkeyPatch) -> None:
        given = {"tmp_path": work, "monkeypatch": mp, "capsys": _NoCapture(), **fixtures}
        test(**{name: given[name] for name in wanted})

    return run


class _NoCapture:
    def readouterr(self) -> Any:
        from collections import namedtuple

        return namedtuple("Captured", "out err")("", "")


#: (row, the column a broken promise counts in, the test that replays it, its parameters)
SCENARIOS: list[tuple[str, str, str, dict[str, Any]]] = [
    ("ABICACHE_CHECK from a folder with a planted module", "planted",
     "test_the_background_check_never_imports_from_the_callers_folder", {}),
    ("ABICACHE_CHECK=1, 31 hits: checks over the cap", "excess", "test_background_checks_are_bounded_per_store", {}),
    ("remote prune of a file:// remote", "lost", "test_prune_of_a_folder_remote_keeps_entries_whose_blobs_are_there", {}),
    ("links in a folder remote's gc/ during a prune", "outside",
     "test_prune_never_writes_through_a_link_in_the_marks_folder", {}),
    ("a FIFO at a folder remote's blob", "hangs", "test_a_special_file_at_a_blob_path_is_refused_within_the_timeout",
     {"plant": "fifo"}),
    ("an HTTP server dripping status line and headers", "hangs",
     "test_an_http_remote_that_drips_its_headers_is_cut_off_at_the_timeout", {}),
    ("the observer under umask 002", "stale", "test_the_observer_runs_whatever_the_umask_and_the_store_path",
     {"umask": 0o002, "store": "store"}),
    ("the observer for a store path with a space and a colon", "stale",
     "test_the_observer_runs_whatever_the_umask_and_the_store_path", {"umask": 0o022, "store": "a store: with a space"}),
    ("a wheel's store installed under umask 002", "unrecoverable",
     "test_a_read_only_store_pip_installed_under_umask_002_serves_and_is_never_written", {}),
    ("a read-only store left group-writable (chmod in place)", "outside",
     "test_a_read_only_store_others_may_write_is_refused_and_left_as_it_is", {}),
    ("names over 143 bytes (eCryptfs stand-in)", "unrecoverable",
     "test_manifests_fall_back_to_the_file_where_names_are_short", {"pathconf_says": "255"}),
    ("a FIFO at a log's name", "hangs", "test_a_fifo_or_link_in_the_log_folder_neither_hangs_nor_redirects",
     {"plant": "fifo"}),
    ("a link at a log's name", "outside", "test_a_fifo_or_link_in_the_log_folder_neither_hangs_nor_redirects",
     {"plant": "symlink"}),
]


def rows(work: Path, scale: float, row_of: Callable[[str], Any]) -> list[tuple[Any, Callable[[Any], None]]]:
    """(row, its run) for bench/faults.py's plan."""
    import test_lease as lease
    import test_neighbours as n

    trials = max(1, int(5 * scale))

    def plan(name: str, column: str, scenario: Callable[[Path, pytest.MonkeyPatch], None],
             needs: str | None = None) -> tuple[Any, Callable[[Any], None]]:
        def run(row: Any) -> None:
            if needs is not None:
                row.note = f"skipped: {needs}"
                return
            _trials(row, column, trials, scenario)

        return row_of(name), run

    out = [
        plan("a store's config file names the attacker's group (as nobody)", "planted",
             _call(n.test_a_planted_store_file_cannot_name_the_attackers_group), needs=hostile.why_not()),
        plan("a store's config file widens trust (shared, remote, keys, observe=0)", "planted", _widening(n)),
        *(plan(name, column, _call(getattr(n, test), **params)) for name, column, test, params in SCENARIOS),
    ]
    out += [plan(f"{name} (S3, Redis)", column, scenario) for name, column, scenario in _fleet_scenarios(lease)]
    return out


def _widening(n: Any) -> Callable[[Path, pytest.MonkeyPatch], None]:
    cases = [("shared", "users", "ABICACHE_SHARED"), ("remote", "file:///tmp/theirs", "ABICACHE_REMOTE"),
             ("trusted_keys", "ed25519:AAAA", "ABICACHE_TRUSTED_KEYS"), ("observe", "0", "ABICACHE_OBSERVE"),
             ("read_stores", "/tmp/theirs", "ABICACHE_READ_STORES"), ("verify_age", "99999999", "ABICACHE_VERIFY_AGE")]

    def run(work: Path, mp: pytest.MonkeyPatch) -> None:
        for i, case in enumerate(cases):
            n.test_a_store_file_may_not_widen_trust(work / str(i), mp, *case)

    return run


def _fleet_scenarios(lease: Any) -> list[tuple[str, str, Callable[[Path, pytest.MonkeyPatch], None]]]:
    """The replays, against real SeaweedFS and Redis servers started for the row."""

    def on_both(test: Callable[..., None]) -> Callable[[Path, pytest.MonkeyPatch], None]:
        def run(work: Path, mp: pytest.MonkeyPatch) -> None:
            from abicache import remote as remote_mod
            from abicache.remote import keys
            from remote_fixtures import Raw, make_remote_for

            os.environ.update(servers.CREDENTIALS)
            pair = work / "keys" / "ci.key"
            pair.parent.mkdir(parents=True)
            keys.write_pair(pair)
            signing = (str(pair), str(pair.with_name("ci.key.pub")))
            with servers.seaweedfs_s3() as endpoint, servers.redis_server() as redis:
                s3 = servers.s3_url(endpoint, "replay")
                for name, remote in (("s3", (s3, Raw(s3, servers.raw_s3(endpoint), "replay"))),
                                     ("redis", make_remote_for(redis))):
                    remote_mod.reset()
                    test(work / name, remote, signing)

        return run

    return [
        ("a signed failure record written back 20 minutes later", "refused",
         on_both(lambda w, r, s: _mkdir_then(lease.test_a_signed_failure_record_written_back_later_is_not_believed,
                                             w, r, s))),
        ("old signed leases written back in turn", "hangs",
         on_both(lambda w, r, s: _mkdir_then(lease.test_old_signed_leases_written_back_in_turn_do_not_stall_the_fleet,
                                             w, r, s))),
    ]


def _mkdir_then(test: Callable[..., None], work: Path, remote: Any, signing: Any) -> None:
    work.mkdir(parents=True, exist_ok=True)
    test(work, remote, signing)
