"""Files that survive crashes and full disks: the one way the kit writes a file (``write_file``) or a folder
(``write_folder``) (temporary ``.<name>.<pid>.tmp`` beside it, flushed, then moved over it), the run folder's lock,
the removal of temporary files left by killed writes, and the bounded reading of YAML records (docs/faults.md)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import shutil
import socket
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

LOGGER = logging.getLogger(__name__)

_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.tmp(\.\w+)?$")
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


def format_bytes(nbytes: float | None) -> str:
    """``1.23 GiB``, ``45.60 MiB``, ``512 B``; ``-`` for None (unknown). For display only: the kit keeps bytes."""
    if nbytes is None:
        return "-"
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{int(nbytes)} B"


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


def temporary_path(path: Path, keep_suffix: bool = False) -> Path:
    """``<folder>/.<name>.<pid>.tmp``: where ``path`` is written before it replaces the old file
    (``keep_suffix``: ``.tmp.mp4`` and the like, for writers that choose the format by the suffix)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp{path.suffix if keep_suffix else ''}")


class OwnInputError(ValueError):
    """A command was about to write over one of its own input files."""


def refuse_own_input(path: Path, inputs: Iterable[str | Path]) -> None:
    """Raise ``OwnInputError`` when ``path`` is (the same file as) one of ``inputs``."""
    if not path.exists():
        return
    for item in inputs:
        item = Path(item)
        with contextlib.suppress(OSError):
            if item.exists() and os.path.samefile(path, item):
                raise OwnInputError(f"{path} is this command's input {item}: writing the output there would "
                                    "destroy it; choose another output path")


def failed_for_space(error: BaseException, free: int | None, needed: int) -> bool:
    """A failed write that a full disk explains: ENOSPC or EDQUOT, or a writer failing with little room left
    (torch reports a full disk as "unexpected pos"; the space the partial file took is free again when this is
    asked, hence the factor 2)."""
    if is_out_of_space(error):
        return True
    text = str(error)
    torch_write = isinstance(error, RuntimeError) and ("unexpected pos" in text or "failed writing" in text)
    return torch_write and (free is None or free < 2 * needed)


def write_file(path: str | Path, write: Callable[[Path], object], *, needed: int, what: str | None = None,
               inputs: Iterable[str | Path] = (), keep_suffix: bool = False, durable: bool = True) -> Path:
    """Write ``path`` through ``write(temporary_path)``: the one way the kit writes a file.

    Refuses to write over one of ``inputs``; checks that the folder has ``needed`` bytes free; writes the
    temporary file beside ``path``, flushes it to the disk (``durable``; a picture need not be) and moves it
    over ``path``. On any failure, an interrupt included, the temporary file is removed and ``path`` is as it
    was.

    Raises:
        OwnInputError: ``path`` is one of ``inputs``.
        DiskFullError: not enough room (checked first, or what the failed write says); names the file.
        OSError: another write error, with the path in its message.
    """
    path = Path(path)
    what = what or f"writing {path}"
    refuse_own_input(path, inputs)
    check_free_space(path.parent, needed, what)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path, keep_suffix)
    try:
        write(tmp)
        if durable:
            replace_durably(tmp, path)
        else:
            os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, (OSError, RuntimeError)):
            free = free_bytes(path.parent)
            if failed_for_space(e, free, needed):
                raise DiskFullError(path.parent, needed, free, what) from e
            if isinstance(e, OSError) and str(path) not in str(e):
                raise OSError(e.errno, f"{what}: {e.strerror or e}") from e
        raise
    return path


def write_folder(path: str | Path, fill: Callable[[Path], object], *, needed: int, overwrite: bool = False,
                 what: str | None = None) -> Path:
    """Make the folder ``path`` by ``fill(temporary_folder)``, then move it into place in one step.

    A folder that exists and is not empty is refused unless ``overwrite`` (then it is replaced only once the
    new one is complete: an interrupted or failed ``fill`` leaves it as it was).

    Raises:
        FileExistsError: ``path`` holds files and ``overwrite`` is False (the message says how to go on).
        DiskFullError: not enough room for ``needed`` bytes.
    """
    path = Path(path)
    what = what or f"writing {path}"
    if path.exists() and (not path.is_dir() or any(path.iterdir())) and not overwrite:
        raise FileExistsError(f"{path} already holds files; {what} would overwrite them: choose an empty or new "
                              "folder, or pass overwrite (--overwrite) to replace it")
    check_free_space(path.parent if path.parent.exists() else Path("."), needed, what)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp, old = temporary_path(path), path.with_name(f".{path.name}.{os.getpid()}.old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        fill(tmp)
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not path.exists():
            os.replace(old, path)
        if is_out_of_space(e):
            raise DiskFullError(path.parent, needed, free_bytes(path.parent), what) from e
        raise
    shutil.rmtree(old, ignore_errors=True)
    return path


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


def write_text_atomically(path: Path, text: str, *, inputs: Iterable[str | Path] = ()) -> None:
    """Replace ``path`` with ``text`` through ``write_file``; on failure the old file stays."""
    data = text.encode()
    write_bytes_atomically(path, data, inputs=inputs)


def write_bytes_atomically(path: Path, data: bytes, *, inputs: Iterable[str | Path] = (),
                           durable: bool = True) -> None:
    """Replace ``path`` with ``data`` through ``write_file``; on failure the old file stays."""
    write_file(path, lambda tmp: Path(tmp).write_bytes(data), needed=len(data) + 4096, inputs=inputs,
               durable=durable)


class FolderInUseError(ValueError):
    """Another live process owns the folder (a run writing into it)."""


LOCK_NAME = ".yolo9kit.lock"


class FolderLock:
    """One process at a time in a folder: ``<folder>/.yolo9kit.lock``, locked by its owner (``flock``) and naming
    the owner's pid and host.

    The system drops the lock when its owner ends, however it ends (kill -9, a restarted container, a machine
    lost on a network file system), so ``acquire`` takes over a lock file that no process holds, with a line in
    the log, and refuses one that a live process holds with ``FolderInUseError`` naming it. Where files cannot be
    locked (Windows, a file system without locks) nothing is refused. ``release`` removes the file.
    """

    def __init__(self, folder: str | Path, what: str = "a run") -> None:
        self.path = Path(folder) / LOCK_NAME
        self.what = what
        self.fd: int | None = None

    def acquire(self) -> FolderLock:
        for _ in range(3):  # a file its owner removed between our open and our lock is no lock: open the new one
            fd = os.open(self.path, os.O_CREAT | os.O_RDWR, 0o644)
            if _held_elsewhere(fd, exclusive=True):
                os.close(fd)
                raise FolderInUseError(
                    f"{self.path.parent} is in use by {self._owner() or 'another process'} ({self.what}), which "
                    f"holds its lock {self.path.name} until it ends, however it ends; wait for it or end it, or "
                    "choose another folder (train: another --name)")
            if os.fstat(fd).st_nlink:
                break
            os.close(fd)
        else:
            raise FolderInUseError(f"{self.path.parent}: could not take its lock {self.path}")
        gone = self._owner()
        if gone:
            LOGGER.info("%s: taking over the lock of %s, which is gone", self.path.parent, gone)
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
        self.fd = fd
        return self

    def in_use(self) -> bool:
        """Whether a live process holds the lock (asked by locking the file for an instant)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return False
        try:
            return _held_elsewhere(fd, exclusive=False)
        finally:
            os.close(fd)

    def _owner(self) -> str | None:
        try:
            pid, host = self.path.read_text().split()[:2]
        except (OSError, ValueError):
            return None  # new, unreadable or half written
        return f"process {pid} on {host}"

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):  # Windows keeps an open file: the next run takes it over
                self.path.unlink()  # before the lock goes, so that no process locks a removed file
            os.close(self.fd)
            self.fd = None


def _held_elsewhere(fd: int, exclusive: bool) -> bool:
    """Lock ``fd`` without waiting (``flock``); True when another process holds it. Where files cannot be locked
    (Windows, a file system without locks), False."""
    try:
        import fcntl  # POSIX only

        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except (ImportError, OSError):  # Windows; ENOLCK and the like: a file system without locks
        pass
    return False


def _pid_alive(pid: int) -> bool:
    if not 0 < pid < 2**31:  # no process has such an id (os.kill overflows, or signals a whole group)
        return False
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


class RecordError(ValueError):
    """A YAML record of a run or a study (settings.yaml, state.yaml, tune.yaml, ...) that the kit will not read."""


# The kit's records are a few KB (settings.yaml ~3 KB); a bound keeps a hostile file from taking the machine.
MAX_RECORD_BYTES = 1 << 20


class _RecordLoader(yaml.SafeLoader):
    # Aliases refused: a 400-byte file of nested aliases expands to gigabytes once walked ("billion laughs").
    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not read in the kit's records",
                                              self.peek_event().start_mark)
        return super().compose_node(parent, index)


class _RecordDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:  # a shared object written twice, never as &id/*id
        return True


def dump_record(value: Any) -> str:
    """YAML text of a record (plain values), as the kit writes it: keys in order, no aliases."""
    return yaml.dump(value, Dumper=_RecordDumper, sort_keys=False, allow_unicode=True)


def read_record(path: str | Path, max_bytes: int = MAX_RECORD_BYTES) -> Any:
    """A YAML record the kit wrote (or a person edited), read with bounds: at most ``max_bytes``, no aliases.

    Raises:
        RecordError: larger than ``max_bytes``, unreadable, or not YAML (the message names the file).
        FileNotFoundError: ``path`` does not exist.
    """
    path = Path(path)
    size = path.stat().st_size
    if size > max_bytes:
        raise RecordError(f"{path}: {format_bytes(size)}, more than the {format_bytes(max_bytes)} a record of the "
                          "kit can hold; not read")
    try:
        return yaml.load(path.read_text(encoding="utf-8-sig"), Loader=_RecordLoader)  # noqa: S506 (a safe loader)
    except (yaml.YAMLError, UnicodeDecodeError, RecursionError) as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or (str(e).splitlines()[0] if str(e) else repr(e))
        where = f" line {mark.line + 1}:" if mark is not None else ""
        raise RecordError(f"{path}:{where} not a readable YAML record ({problem})") from None


def path_inside(folder: str | Path, name: str | Path, what: str) -> Path:
    """``folder / name``, refused when ``name`` (read from a record, a storage, a user) leads out of ``folder``.

    Raises:
        ValueError: ``name`` is absolute, empty, or resolves (``..``, a symbolic link) outside ``folder``.
    """
    folder = Path(folder).resolve()
    text = str(name)
    target = (folder / text).resolve()
    if not text or Path(text).is_absolute() or target == folder or not target.is_relative_to(folder):
        raise ValueError(f"{what} {text!r} is not a name inside {folder}; refused")
    return target
