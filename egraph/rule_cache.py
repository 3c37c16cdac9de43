"""The shipped rules' egglog translation, kept on disk between processes.

Reading a shipped rule file and translating its rules to egglog takes about a second (BERT-
Large's rules load in 5.55 s in a fresh process, 4.5 s with the translation cached, on the
development machine), and gives the same text every time for the same rule files and the same
pcgopt. So the first process to translate a selection of
rule files writes the result to a cache file, and later processes read it instead.

The file's name holds a hash of everything the translation depends on: the rule files' bytes,
the source of every pcgopt module (the operator specs and the translator among them), and the
egglog version. A change to any of them is another key, so a stale translation is never read.

Where: ``$PCGOPT_CACHE_DIR``, else ``$XDG_CACHE_HOME/pcgopt``, else ``~/.cache/pcgopt``.
``PCGOPT_CACHE_DIR=""`` turns the cache off. A cache that cannot be written (a read-only home)
or a file that cannot be read back is passed over: the rules are translated as without it.
The newest :data:`KEPT` files are kept, the older removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import importlib.util
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

from pcgopt.egraph.translate import TranslatedRule

#: Bumped when the cache file's layout changes.
FORMAT = 1

#: How many cache files are kept (the newest; a few MB each).
KEPT = 8

#: The packages whose source the translation may depend on (all of pcgopt's).
_PACKAGES = ("pcgopt", "pcgopt.egraph", "pcgopt.rules", "pcgopt.verify", "pcgopt.extract")


def cache_dir() -> Path | None:
    """The directory of the cache files (module docstring), or None when it is turned off."""
    chosen = os.environ.get("PCGOPT_CACHE_DIR")
    if chosen is not None:
        return Path(chosen) if chosen else None
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "pcgopt"


@functools.cache
def code_fingerprint() -> str:
    """A hash of the source of every pcgopt module and of the egglog version."""
    digest = hashlib.sha256()
    digest.update(f"{FORMAT} {metadata.version('egglog')} {sys.version_info[:2]}".encode())
    for name in _PACKAGES:
        # Found without importing them: a lower layer imports no higher one.
        for root in importlib.util.find_spec(name).submodule_search_locations or ():
            for path in sorted(Path(root).rglob("*.py")):
                digest.update(f"{name}/{path.relative_to(root)}".encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()


def translation_key(selection: Sequence[str], files: Sequence[Path]) -> str:
    """The cache key of the translation of the rule ``files`` loaded as ``selection``."""
    digest = hashlib.sha256(code_fingerprint().encode())
    digest.update(json.dumps(list(selection)).encode())
    for path in files:
        digest.update(Path(path).read_bytes())
    return digest.hexdigest()[:40]


def _file(key: str) -> Path | None:
    where = cache_dir()
    return None if where is None else where / f"rules-{key}.json"


def read(key: str) -> tuple[list[TranslatedRule], list[tuple[str, str, str]]] | None:
    """The translated and untranslated rules cached under ``key``, or None (not cached, the
    cache turned off, or a file that does not read back as written)."""
    path = _file(key)
    if path is None or not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT or data.get("key") != key:
            return None
        rules = [TranslatedRule(*map(str, fields)) for fields in data["rules"]]
        skipped = [(str(a), str(b), str(c)) for a, b, c in data["untranslated"]]
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    return rules, skipped


def write(
    key: str, rules: Sequence[TranslatedRule], skipped: Sequence[tuple[str, str, str]]
) -> Path | None:
    """Caches a translation under ``key`` (atomically: a reader never sees half a file);
    returns the file, or None when the cache is off or cannot be written."""
    path = _file(key)
    if path is None:
        return None
    data = {
        "format": FORMAT,
        "key": key,
        "rules": [list(dataclasses.astuple(r)) for r in rules],
        "untranslated": [list(s) for s in skipped],
    }
    temporary = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".rules-", suffix=".tmp")
        with os.fdopen(handle, "w") as out:
            json.dump(data, out)
        os.replace(temporary, path)
    except OSError:
        if temporary is not None:
            with contextlib.suppress(OSError):
                os.unlink(temporary)
        return None
    _prune(path.parent)
    return path


def _prune(where: Path) -> None:
    """Removes all but the :data:`KEPT` newest cache files (each pcgopt version or rule file
    change writes new ones)."""
    with contextlib.suppress(OSError):
        files = sorted(where.glob("rules-*.json"), key=lambda f: f.stat().st_mtime, reverse=True)
        for old in files[KEPT:]:
            old.unlink(missing_ok=True)
