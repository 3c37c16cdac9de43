"""The shipped rules' translation cached between processes (pcgopt.egraph.rule_cache)."""

from __future__ import annotations

import importlib
import json
import os

import pytest

from pcgopt.egraph import rule_cache
from pcgopt.rules import SHIPPED

# The module, not the function the package exports under its name.
saturation = importlib.import_module("pcgopt.egraph.saturate")

#: The smallest shipped rule file: translated in a fraction of a second.
SMALL = ("lookups",)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PCGOPT_CACHE_DIR", str(tmp_path))
    return tmp_path


def _translations(base) -> tuple[list, list]:
    return list(base.rules), list(base.untranslated)


def test_a_second_load_reads_the_translation_the_first_wrote(cache, monkeypatch):
    fresh = saturation._load_shipped_base(SMALL)
    (written,) = cache.glob("rules-*.json")
    assert fresh.rules

    def no_translating(*args):
        raise AssertionError("translated again instead of reading the cache")

    monkeypatch.setattr(saturation, "_translate", no_translating)
    again = saturation._load_shipped_base(SMALL)
    assert _translations(again) == _translations(fresh)
    assert list(cache.glob("rules-*.json")) == [written]


def test_the_key_changes_with_the_rule_files_and_the_selection(tmp_path):
    rules = tmp_path / "rules.json"
    rules.write_bytes(SHIPPED["lookups"].read_bytes())
    key = rule_cache.translation_key(SMALL, [rules])
    assert rule_cache.translation_key(SMALL, [rules]) == key
    assert rule_cache.translation_key(("matrix/parallel",), [rules]) != key
    rules.write_bytes(rules.read_bytes() + b" ")
    assert rule_cache.translation_key(SMALL, [rules]) != key


def test_a_damaged_cache_file_is_passed_over_and_written_again(cache):
    fresh = saturation._load_shipped_base(SMALL)
    (path,) = cache.glob("rules-*.json")
    path.write_text('{"format": 1, "key": "')  # cut short, as by a crash while writing
    assert _translations(saturation._load_shipped_base(SMALL)) == _translations(fresh)
    assert json.loads(path.read_text())["rules"]


def test_a_file_written_under_another_key_is_not_read(cache):
    key = rule_cache.translation_key(SMALL, [SHIPPED["lookups"]])
    rule_cache.write(key, [], [])
    path = next(cache.glob("rules-*.json"))
    data = json.loads(path.read_text())
    data["key"] = "0" * 40
    path.write_text(json.dumps(data))
    assert rule_cache.read(key) is None


def test_an_empty_cache_directory_setting_turns_the_cache_off(tmp_path, monkeypatch):
    monkeypatch.setenv("PCGOPT_CACHE_DIR", "")
    monkeypatch.chdir(tmp_path)
    assert rule_cache.cache_dir() is None
    assert rule_cache.write("k" * 40, [], []) is None
    assert rule_cache.read("k" * 40) is None
    assert saturation._load_shipped_base(SMALL).rules
    assert list(tmp_path.iterdir()) == []


def test_a_cache_that_cannot_be_written_is_passed_over(tmp_path, monkeypatch):
    blocked = tmp_path / "a file, not a directory"
    blocked.write_text("")
    monkeypatch.setenv("PCGOPT_CACHE_DIR", str(blocked / "pcgopt"))
    assert rule_cache.write("k" * 40, [], []) is None
    assert saturation._load_shipped_base(SMALL).rules


def test_only_the_newest_files_are_kept(cache):
    old = [cache / f"rules-{k:040d}.json" for k in range(rule_cache.KEPT + 2)]
    for age, path in enumerate(old, start=1):  # the first is the newest
        path.write_text("{}")
        os.utime(path, (1e9 - age, 1e9 - age))
    new = rule_cache.write("n" * 40, [], [])
    kept = set(cache.glob("rules-*.json"))
    assert kept == {new, *old[: rule_cache.KEPT - 1]}
