"""Where tightfit keeps what it derives once per machine: exported zoo models, the native
kernels' library, the cost profile. A module of its own below every package that caches.

Cache files are trusted for nothing: a reader checks what it reads and treats a damaged or
wrongly shaped file as absent (it is rebuilt and written over). Whole files are written to a
temporary name and renamed, so a reader never sees half of one. A directory that cannot be
written is used read-only (what is derived stays in memory) after one warning line on stderr.
Tables of timings (`JournaledTable`) are saved as they are measured, appended to a journal under
a file lock, so a killed process keeps every entry it measured and concurrent writers lose
nothing."""
from __future__ import annotations

import fcntl
import json
import math
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator


def cache_dir() -> Path | None:
    """$TIGHTFIT_CACHE if set (0/off/no: no disk cache), else $XDG_CACHE_HOME/tightfit or
    ~/.cache/tightfit."""
    setting = os.environ.get("TIGHTFIT_CACHE", "").strip()
    if setting.lower() in ("0", "off", "no", "false", "none"):
        return None
    if setting and setting.lower() not in ("1", "on", "yes", "true"):
        return Path(setting).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tightfit"


_WARNED: set[str] = set()


def warn_unwritable(directory: Path, error: OSError) -> None:
    """One line on stderr per directory and process: the cache is used in memory only."""
    key = str(directory)
    if key not in _WARNED:
        _WARNED.add(key)
        why = error.strerror or type(error).__name__
        print(f"tightfit: warning: cache directory {directory} is not writable ({why}); "
              f"what is derived is kept in memory only", file=sys.stderr, flush=True)


def write_atomic(path: Path, data: bytes) -> None:
    """Write beside the target and rename (concurrent readers never see half a file). OSError
    propagates; nothing partial remains."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def write_cache(path: Path, data: bytes) -> bool:
    """`write_atomic` for a cache file: an unwritable directory is one warning, not an error.
    Returns whether the file was written."""
    try:
        write_atomic(path, data)
        return True
    except OSError as e:
        warn_unwritable(path.parent, e)
        return False


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` + '.lock' (fcntl.flock: released when the process dies, so a
    killed holder blocks no one). OSError when the lock file cannot be made."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(str(path) + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def read_json(path: Path) -> Any:
    """The JSON value in `path`, or None if it is missing or not JSON."""
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None


def is_seconds(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


class JournaledTable:
    """A dict of JSON entries per name, on disk as a snapshot (`path`, a JSON object written
    whole) plus a journal (`path` + '.journal', one JSON object per line) of the entries added
    since; both are read and written under `file_lock(path)`.

    `valid(entry)` says whether one entry read back has the right shape: a snapshot that is not
    an object of valid entries is dropped as a whole (rebuilt by the next `compact`), a journal
    line that is not one valid entry is skipped (a process killed mid-line leaves at most one).
    Entries are merged as dicts, so an entry may be given in pieces."""

    def __init__(self, path: Path, valid: Callable[[str, dict], bool]):
        self.path = path
        self.journal = path.with_name(path.name + ".journal")
        self.valid = valid
        self.writable = True

    def load(self) -> dict[str, dict]:
        """The snapshot and the journal, merged (later entries win). Missing or damaged: {}."""
        try:
            with file_lock(self.path):
                return self._read()
        except OSError:  # a read-only directory without a lock file: read unlocked
            return self._read()

    def _read(self) -> dict[str, dict]:
        snapshot = read_json(self.path)
        table: dict[str, dict] = {}
        if isinstance(snapshot, dict) and all(isinstance(e, dict) and self.valid(k, e) for k, e in snapshot.items()):
            table = {k: dict(e) for k, e in snapshot.items()}
        for name, entry in self._journal_lines():
            table.setdefault(name, {}).update(entry)
        return table

    def _journal_lines(self) -> Iterator[tuple[str, dict]]:
        try:
            text = self.journal.read_bytes()
        except OSError:
            return
        for line in text.splitlines():
            try:
                item = json.loads(line)
            except (ValueError, RecursionError):
                continue
            if (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], dict)
                    and self.valid(item[0], item[1])):
                yield item[0], item[1]

    def append(self, name: str, entry: dict) -> None:
        """Save one entry now (one line appended to the journal)."""
        if not self.writable:
            return
        line = (json.dumps([name, entry], sort_keys=True) + "\n").encode()
        try:
            with file_lock(self.path):
                fd = os.open(self.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
                try:
                    os.write(fd, line)
                finally:
                    os.close(fd)
        except OSError as e:
            self._unwritable(e)

    def compact(self, mine: dict[str, dict]) -> None:
        """Rewrite the snapshot as what is on disk merged with `mine` (mine win), and empty the
        journal: all under the lock, so entries another process appended meanwhile are kept."""
        if not self.writable:
            return
        try:
            with file_lock(self.path):
                table = self._read()
                for name, entry in mine.items():
                    table.setdefault(name, {}).update(entry)
                write_atomic(self.path, json.dumps(table, sort_keys=True).encode())
                # After the rename: a kill between the two leaves entries twice, never none.
                with open(self.journal, "wb"):
                    pass
        except OSError as e:
            self._unwritable(e)

    def _unwritable(self, error: OSError) -> None:
        self.writable = False
        warn_unwritable(self.path.parent, error)
