"""Files that survive crashes and full disks (docs/faults.md): the one writer of a file (``write_file``) or a folder
(``write_folder``), the run folder's lock, the removal of killed writes' temporaries, bounded YAML records."""

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
_NO_SPACE = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}  # a full disk, an exhausted quota


class DiskFullError(OSError):
    """Not enough free space for a write (``folder``, ``needed`` bytes, ``free`` or None); nothing was changed."""

    def __init__(self, folder: Path, needed: int, free: int | None, what: str) -> None:
        self.folder, self.needed, self.free = Path(folder), int(needed), free
        have = "less" if free is None else format_bytes(free)
        super().__init__(f"disk full: {what} needs about {format_bytes(needed)} in {folder}, which has {have} free; "
                         "free some space there (or write to another disk, e.g. project=/--project) and run again. "
                         "Files already in the folder were not changed")
        self.errno = errno.ENOSPC


def format_bytes(nbytes: float | None) -> str:
    """``1.23 GiB``, ``45.60 MiB``, ``512 B``; ``-`` for None (unknown)."""
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


def temporary_path(path: Path, keep_suffix: bool = False) -> Path:
    """``<folder>/.<name>.<pid>.tmp`` (``keep_suffix``: ``.tmp.mp4``, for writers that go by the suffix)."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp{path.suffix if keep_suffix else ''}")


class OwnInputError(ValueError):
    """A command was about to write over one of its own input files."""


def refuse_own_input(path: Path, inputs: Iterable[str | Path]) -> None:
    """Raise ``OwnInputError`` when ``path`` is (the same file as) one of ``inputs``."""
    for item in inputs:
        with contextlib.suppress(OSError):  # either file missing: not the same
            if os.path.samefile(path, item):
                raise OwnInputError(f"{path} is this command's input {item}: writing the output there would "
                                    "destroy it; choose another output path")


def write_file(path: str | Path, write: Callable[[Path], object], *, needed: int, what: str | None = None,
               inputs: Iterable[str | Path] = (), keep_suffix: bool = False, durable: bool = True) -> Path:
    """Write ``path`` through ``write(temporary_path)``, then move it over ``path``; returns ``path``. On any failure
    (an interrupt included) the temporary file is removed and ``path`` is as it was.

    Args:
        needed: the bytes the folder must have free.
        what: the write, as error messages name it (default: "writing <path>").
        inputs: files of the command that ``path`` must not be.
        keep_suffix: the temporary file ends with ``path``'s suffix.
        durable: flush it to the disk before the move (a picture need not be).

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
        (replace_durably if durable else os.replace)(tmp, path)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)  # write_folder's
        tmp.unlink(missing_ok=True)
        if isinstance(e, (OSError, RuntimeError)):
            free = free_bytes(path.parent)
            # torch's "unexpected pos" with little room (the partial file's space is free again) is a full disk too
            torch_full = isinstance(e, RuntimeError) and any(t in str(e) for t in ("unexpected pos", "failed writing"))
            no_space = isinstance(e, OSError) and e.errno in _NO_SPACE
            if no_space or (torch_full and (free is None or free < 2 * needed)):
                raise DiskFullError(path.parent, needed, free, what) from e
            if isinstance(e, OSError) and str(path) not in str(e):
                raise OSError(e.errno, f"{what}: {e.strerror or e}") from e
        raise
    return path


def write_folder(path: str | Path, fill: Callable[[Path], object], *, needed: int, overwrite: bool = False,
                 what: str | None = None) -> Path:
    """Make the folder ``path`` by ``fill(temporary_folder)``, then move it into place in one step; returns ``path``.

    Args:
        needed: the bytes the disk must have free.
        overwrite: replace a folder that holds files (once the new one is complete).
        what: the write, as error messages name it.

    Raises:
        FileExistsError: ``path`` holds files and ``overwrite`` is False (the message says how to go on).
        DiskFullError: not enough room for ``needed`` bytes.
    """
    path = Path(path)
    what = what or f"writing {path}"
    if path.exists() and (not path.is_dir() or any(path.iterdir())) and not overwrite:
        raise FileExistsError(f"{path} already holds files; {what} would overwrite them: choose an empty or new "
                              "folder, or pass overwrite (--overwrite) to replace it")
    old = path.with_name(f".{path.name}.{os.getpid()}.old")

    def write(tmp: Path) -> None:  # the old folder is set aside last, for write_file to move the new one in
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        fill(tmp)
        if path.exists():
            os.replace(path, old)

    try:
        return write_file(path, write, needed=needed, what=what, durable=False)
    finally:  # the old folder back where the new one is not, else removed
        if old.exists() and not path.exists():
            os.replace(old, path)
        shutil.rmtree(old, ignore_errors=True)


def replace_durably(tmp: Path, path: Path) -> None:
    """Flush ``tmp`` to the disk, then move it over ``path``: the old or the new file, also after a power cut."""
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


def write_text_atomically(path: Path, text: str | bytes, *, inputs: Iterable[str | Path] = ()) -> None:
    """Replace ``path`` with ``text`` (bytes as they are) through ``write_file``; on failure the old file stays."""
    data = text.encode() if isinstance(text, str) else text
    write_file(path, lambda tmp: Path(tmp).write_bytes(data), needed=len(data) + 4096, inputs=inputs)


class FolderInUseError(ValueError):
    """Another live process owns the folder (a run writing into it)."""


LOCK_NAME = ".yolo9kit.lock"


class FolderLock:
    """One process at a time in a folder (docs/faults.md): ``<folder>/.yolo9kit.lock``, ``flock``ed by its owner;
    ``acquire`` raises ``FolderInUseError`` when a live process holds it (nothing is refused where files cannot be
    locked)."""

    def __init__(self, folder: str | Path, what: str = "a run") -> None:
        self.path, self.what = Path(folder) / LOCK_NAME, what
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
        if gone := self._owner():
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
    """Lock ``fd`` without waiting (``flock``); True when another process holds it, False where nothing locks."""
    try:
        import fcntl  # POSIX only

        fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except (ImportError, OSError):  # Windows; ENOLCK and the like: a file system without locks
        pass
    return False


def _pid_alive(pid: int) -> bool:
    # False for: no possible process id (os.kill overflows, or signals a group); this process (starting: none of
    # its writes is in progress); Windows (os.kill(pid, 0) ends the process; an open file refuses unlink anyway)
    if not 0 < pid < 2**31 or pid == os.getpid() or os.name != "posix":
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by someone else
        pass
    return True


def remove_stale_temporaries(folder: str | Path) -> None:
    """Delete the temporary files of killed writes in ``folder`` (a live process's stay)."""
    folder = Path(folder)
    for path in folder.iterdir() if folder.is_dir() else ():
        match = _TEMPORARY.match(path.name)
        if not match or not path.is_file() or _pid_alive(int(match["pid"])):
            continue
        size = path.stat().st_size
        try:
            path.unlink()
            LOGGER.info("removed %s (%s), left by a killed write of %s", path, format_bytes(size), match["name"])
        except OSError as e:  # in use (Windows) or read-only: leave it
            LOGGER.debug("could not remove %s: %s", path, e)


class RecordError(ValueError):
    """A YAML record of a run or a study (settings.yaml, state.yaml, tune.yaml, ...) that the kit will not read."""


MAX_RECORD_BYTES = 1 << 20  # records are a few KB (settings.yaml ~3 KB): a hostile file does not take the machine


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
    """The value of a YAML record the kit wrote (or a person edited): at most ``max_bytes``, no aliases.

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
