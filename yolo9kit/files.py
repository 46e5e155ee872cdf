"""Files that survive crashes and full disks: free-space checks with a clear error, atomic replacement
(temporary file, fsync, ``os.replace``), and the removal of temporary files left by killed writes.

A temporary file is named ``.<name>.<pid>.tmp`` beside its destination, so that the next run in the
folder can tell the leftovers of a killed process from a write in progress.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
from pathlib import Path

LOGGER = logging.getLogger(__name__)

_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.tmp$")
# Errors a write gets from a full disk or an exhausted quota.
_NO_SPACE = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


class DiskFullError(OSError):
    """Not enough free space to write a file; nothing already in the folder was changed.

    Attributes:
        folder: where the file was to be written.
        needed: bytes the write needs (an estimate from the data to write).
        free: bytes free there when it was checked (None when the file system does not say).
    """

    def __init__(self, folder: Path, needed: int, free: int | None, what: str) -> None:
        self.folder, self.needed, self.free = Path(folder), int(needed), free
        have = "less" if free is None else format_bytes(free)
        super().__init__(f"disk full: {what} needs about {format_bytes(needed)} in {folder}, which has {have} free; "
                         "free some space there (or write to another disk, e.g. project=/--project) and run again. "
                         "Files already in the folder were not changed")
        self.errno = errno.ENOSPC


def format_bytes(n: float) -> str:
    """``12.6 MB``: decimal units, three significant digits."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} TB"  # pragma: no cover - the loop returns


def free_bytes(folder: str | Path) -> int | None:
    """Free bytes on the file system of ``folder`` (or of its nearest existing parent); None when unknown."""
    probe = Path(folder).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return int(shutil.disk_usage(probe).free)
    except OSError:  # some network and virtual file systems do not report it: do not block the write
        return None


def check_free_space(folder: str | Path, needed: int, what: str) -> None:
    """Raise ``DiskFullError`` when ``folder`` has less than ``needed`` bytes free (nothing is written)."""
    free = free_bytes(folder)
    if free is not None and free < needed:
        raise DiskFullError(Path(folder), needed, free, what)


def is_out_of_space(error: BaseException) -> bool:
    """True for an OSError of a full disk or quota (``ENOSPC``, ``EDQUOT``)."""
    return isinstance(error, OSError) and error.errno in _NO_SPACE


def temporary_path(path: Path) -> Path:
    """``<folder>/.<name>.<pid>.tmp``: where ``path`` is written before it replaces the old file."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp")


def replace_durably(tmp: Path, path: Path) -> None:
    """Flush ``tmp`` to the disk, then move it over ``path`` (readers see the old or the new file, also after a
    power cut: without the flush a file system may commit the rename before the data)."""
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    if os.name == "posix":  # the rename itself is durable once the folder is flushed
        with contextlib.suppress(OSError):
            fd = os.open(path.parent, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


def write_text_atomically(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` (temporary file + ``replace_durably``); on failure the old file stays."""
    tmp = temporary_path(path)
    try:
        with open(tmp, "w", newline="") as f:
            f.write(text)
        replace_durably(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # this process is starting: none of its writes is in progress
    if os.name != "posix":  # Windows: os.kill(pid, 0) would end the process; an open file refuses unlink anyway
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        return True
    return True


def remove_stale_temporaries(folder: str | Path) -> list[Path]:
    """Delete the temporary files of killed writes (``.<name>.<pid>.tmp`` of a process that is gone) in
    ``folder``; returns what was removed. A write still in progress in another process is left alone."""
    folder = Path(folder)
    removed = []
    if not folder.is_dir():
        return removed
    for path in folder.iterdir():
        match = _TEMPORARY.match(path.name)
        if not match or not path.is_file() or _pid_alive(int(match["pid"])):
            continue
        size = path.stat().st_size
        try:
            path.unlink()
        except OSError as e:  # in use (Windows) or read-only: leave it
            LOGGER.debug("could not remove %s: %s", path, e)
            continue
        LOGGER.info("removed %s (%s), left by a killed write of %s", path, format_bytes(size), match["name"])
        removed.append(path)
    return removed
