"""Settings are checked at first use, one way: a bad value is one clear error, whether the
call would hit or miss, naming the setting, its value, where it was set and what is
accepted; an ABICACHE_* variable that is no setting gets one warning naming the closest."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from abicache import Cache
from abicache.errors import AbicacheWarning, ConfigError
from abicache.settings import settings_file

from conftest import run_py, writer

HIT_OR_MISS = """
import sys
from abicache import Cache
from abicache.errors import ConfigError
try:
    Cache(sys.argv[1] if len(sys.argv) > 1 else None).get_or_build("t", "{name}", {{}}, lambda out: None)
except ConfigError as exc:
    print(exc)
    raise SystemExit(3)
"""


@pytest.mark.parametrize(("name", "value", "accepted"), [
    ("ABICACHE_MAX_SIZE", "10X", "like 10G or 500M"),
    ("ABICACHE_VERIFY_AGE", "abc", "number of seconds"),
    ("ABICACHE_BUILD", "sometimes", "auto, never, always"),
])
def test_a_bad_value_is_the_same_error_on_a_hit_and_on_a_miss(tmp_path: Path, name: str, value: str,
                                                              accepted: str) -> None:
    """Before: the size cap warned, and only on a miss; the build mode failed only on a
    miss; the verify age failed on every hit."""
    root = tmp_path / "s"
    Cache(root).get_or_build("t", "there", {}, writer({"f": b"x"}))  # what the hit finds
    for entry in ("there", "missing"):
        out = run_py(f"import sys; sys.argv[1:] = [{str(root)!r}]\n" + HIT_OR_MISS.format(name=entry),
                     env={"ABICACHE_DIR": str(root), name: value})
        assert out.returncode == 3, (entry, out.stdout, out.stderr)
        line = out.stdout.strip()
        assert f"{name}={value!r}" in line and accepted in line and "(from the environment)" in line, line
        assert "Traceback" not in out.stderr


def test_every_bad_setting_is_named_at_once_with_where_it_was_set(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    user = settings_file.user_file()
    user.parent.mkdir(parents=True)
    user.write_text('lock_timeout = "soon"\n')
    settings_file.forget()
    monkeypatch.setenv("ABICACHE_MAX_SIZE", "lots")
    with pytest.raises(ConfigError) as caught:
        Cache(tmp_path / "s").store  # noqa: B018  a Cache reads its settings at its first use
    text = str(caught.value)
    assert "ABICACHE_MAX_SIZE='lots'" in text and "(from the environment)" in text
    assert "ABICACHE_LOCK_TIMEOUT='soon'" in text and f"(from {user})" in text
    monkeypatch.delenv("ABICACHE_MAX_SIZE")
    user.write_text('lock_timeout = "30"\n')
    settings_file.forget()
    assert Cache(tmp_path / "s").lock_timeout == 30


def test_an_abicache_variable_that_is_no_setting_is_said_once_with_the_closest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ABICACHE_ROOT", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("ABICACHE_VERIFY_AGES", "10")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", AbicacheWarning)
        Cache(tmp_path / "s").store  # noqa: B018  a Cache reads its settings at its first use
        Cache(tmp_path / "s").store  # noqa: B018
    said = [str(w.message) for w in seen if issubclass(w.category, AbicacheWarning)]
    assert len([m for m in said if "ABICACHE_ROOT" in m]) == 1 and "ABICACHE_DIR" in said[0], said
    assert any("ABICACHE_VERIFY_AGES is not an abicache setting" in m and "did you mean ABICACHE_VERIFY_AGE?" in m
               for m in said), said
    assert not (tmp_path / "elsewhere").exists()


def test_the_store_is_dir_everywhere(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ABICACHE_DIR, the config file's `dir`, and --dir on the command line (--root still works)."""
    from abicache.cli import main

    Cache(tmp_path / "s").get_or_build("t", "k", {}, writer({"f": b"x"}))
    assert main(["ls", "--dir", str(tmp_path / "s")]) == 0
    by_dir = capsys.readouterr().out
    assert main(["ls", "--root", str(tmp_path / "s")]) == 0
    assert capsys.readouterr().out == by_dir and "1 entry" in by_dir
    assert os.environ.get("ABICACHE_ROOT") is None


def test_every_default_parses_so_a_process_with_none_set_skips_the_parses(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """check_once skips the parses where no setting is in the environment and no config file
    exists (a fresh process's first Cache): sound only while every default is a good value."""
    from abicache.settings import checked, config

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("ABICACHE_DIR", str(tmp_path / "s"))
    for name in checked.PARSERS:
        monkeypatch.delenv(name, raising=False)
    settings_file.forget()
    assert config.no_files()
    assert checked.problems() == {}
    parsed: list[str] = []
    monkeypatch.setattr(checked, "problems", lambda: parsed.append("parsed") or {})
    checked._passed.clear()
    checked.check_once()
    assert parsed == []  # skipped: nothing to parse but defaults
    monkeypatch.setenv("ABICACHE_EXPLAIN", "1")
    checked.check_once()
    assert parsed == ["parsed"]  # one set: every setting parsed
