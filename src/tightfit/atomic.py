"""Files written whole or not at all: every file tightfit writes goes to a temporary name in the
target's folder and is renamed over the target once complete (a rename within one file system
is atomic), so a full disk, a kill or an error leaves the old file or none, never half of one.
An OSError on output becomes OutputError: one line naming the path and the reason.

Temporaries live in LIVE while they exist, so an interrupted command can remove them
(`remove_temporaries`) even where no `finally` got to run."""
from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tightfit.errors import TightfitError

LIVE: set[Path] = set()  # temporary files and folders not yet renamed or removed


class OutputError(TightfitError):
    """An output could not be written (full disk, no permission, a file where a folder should be)."""


def output_error(path: Path | str, e: OSError) -> OutputError:
    blocking = next((p for p in Path(path).parents if p.exists() and not p.is_dir()), None)
    why = f"{blocking} is a file, not a folder" if blocking is not None else (e.strerror or str(e))
    return OutputError(f"cannot write {path}: {why}")


def _umask() -> int:
    try:
        with open("/proc/self/status") as f:
            return next(int(l.split()[1], 8) for l in f if l.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        return 0o022


def _create_beside(path: Path) -> Path:
    """An empty new file named after `path` in its folder, with the mode the user's umask gives
    a new file (mkstemp's would be 0600)."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            return tmp
        except FileExistsError:
            continue


def _remove(tmp: Path) -> None:
    LIVE.discard(tmp)
    try:
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink()
    except OSError:
        pass


@contextmanager
def replacing(path: Path | str) -> Iterator[Path]:
    """A temporary path beside `path` to write; renamed to `path` when the block ends normally,
    removed when it raises. OSError (in the block or the rename) is raised as OutputError."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _create_beside(path)
    except OSError as e:
        raise output_error(path, e) from None
    LIVE.add(tmp)
    try:
        yield tmp
        os.replace(tmp, path)
        LIVE.discard(tmp)
    except OSError as e:
        _remove(tmp)
        raise output_error(path, e) from None
    except BaseException:
        _remove(tmp)
        raise


def write_bytes(path: Path | str, data: bytes) -> Path:
    """`data` into `path`, whole or not at all (flushed to disk before the rename)."""
    with replacing(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)


def write_text(path: Path | str, text: str) -> Path:
    return write_bytes(path, text.encode())


@contextmanager
def temporary_dir(beside: Path | str) -> Iterator[Path]:
    """A fresh folder next to `beside` (same file system, so its files can be renamed into
    place), removed when the block ends, whatever is left in it. OSError: OutputError."""
    beside = Path(beside)
    try:
        beside.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{beside.name}.", dir=beside.parent))
        os.chmod(tmp, 0o777 & ~_umask())  # it may become the output folder: the mode of a new one
    except OSError as e:
        raise output_error(beside, e) from None
    LIVE.add(tmp)
    try:
        yield tmp
    except OSError as e:
        raise output_error(beside, e) from None
    finally:
        _remove(tmp)


def track(path: Path | str) -> Path:
    """A temporary made elsewhere (a job file for a worker), removed by `discard` or, if the
    command is interrupted first, by `remove_temporaries`."""
    LIVE.add(Path(path))
    return Path(path)


def discard(path: Path | str) -> None:
    _remove(Path(path))


def remove_temporaries() -> None:
    """Remove every temporary still live (an interrupted command, on its way out)."""
    for tmp in list(LIVE):
        _remove(tmp)


# --- output folders ---------------------------------------------------------------------------

_RENAME_EXCHANGE = 2  # linux/fs.h: renameat2 swaps two names in one step
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap folders `a` and `b` in one atomic step (Linux renameat2); False where the platform or
    file system has no such call (the caller then renames twice)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: not supported here
        return False
    raise OSError(err, os.strerror(err), str(b))


def check_output_folder(out: Path | str, force: bool = False, option: str = "--out") -> Path:
    """`out` as a folder a command may write: refused (OutputError, one line) when it is the root,
    the current folder or one above it, a file or a link, or a folder that holds something and
    `force` is not given. Called before the work starts (no search wasted) and again at the end."""
    out = Path(out)
    where = Path(os.path.abspath(out))
    here = Path.cwd()
    if where == Path(where.anchor) or where == here or where in here.parents:
        what = "the root folder" if where == Path(where.anchor) else "the current folder or one above it"
        raise OutputError(f"{option} {out} is {what}, which a command never replaces: name a new folder, e.g. {option} ./exported")
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        kind = "a symbolic link" if out.is_symlink() else "a file"
        raise OutputError(f"{option} {out} is {kind}; it is not replaced by a folder: remove it, or name a new folder")
    if out.is_dir() and not force and any(out.iterdir()):
        raise OutputError(f"{option} {out} exists and is not empty: give --force to replace it whole, or name a new folder")
    return out


@contextmanager
def output_folder(out: Path | str, force: bool = False, option: str = "--out") -> Iterator[Path]:
    """A fresh folder beside `out` to fill; when the block ends normally it takes `out`'s place in
    one step (an existing folder there is swapped out and removed), when it raises or a signal
    unwinds it, it is removed and `out` is as it was. See `check_output_folder` for what is refused."""
    out = check_output_folder(out, force, option)
    with temporary_dir(out) as tmp:
        yield tmp
        check_output_folder(out, force, option)  # the folder may have changed while we worked
        try:
            _put_in_place(tmp, out)
        except OSError as e:
            raise output_error(out, e) from None


def _put_in_place(tmp: Path, out: Path) -> None:
    if not out.exists():
        os.rename(tmp, out)  # fails rather than replace a non-empty folder made in the meantime
        LIVE.discard(tmp)
    elif not _exchange(tmp, out):  # the old folder is now at `tmp`: removed with it
        old = track(out.with_name(f".{out.name}.old.{secrets.token_hex(4)}"))
        os.rename(out, old)
        os.rename(tmp, out)
        LIVE.discard(tmp)
        discard(old)
