"""Writing to a path the user gave, without destroying anything that is there.

Every file written at a user's path goes through :func:`check_output` (before any work) and
:func:`write_output` / :func:`output_file`. A regular file is replaced atomically (temporary file in
the same folder, then rename) keeping its permission bits and, where allowed, owner and group; a new
file gets ``0666`` less the umask. A symbolic link stays a link and its target is written. A FIFO or
character device is written into, never replaced (a FIFO with no reader is refused). A folder, block
device, socket, missing folder, unwritable place or a name ending in a separator is refused with one
:class:`OutputPathError` line naming the path. Rules in full: docs/design/core.md.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

__all__ = ["OutputPathError", "InputPathError", "check_output", "write_output", "output_file", "resolve_output",
           "read_input", "release_outputs"]

_MAX_LINKS = 40  # as the kernel's own limit on symbolic links in one lookup

# FIFOs check_output opened for writing, by (st_dev, st_ino)
_held_fifos: dict[tuple[int, int], int] = {}


class OutputPathError(ValueError):
    """An output path that cannot be written without harm; the message is one line naming it."""


def _why(e: OSError) -> str:
    return e.strerror or str(e)


def resolve_output(path: str | os.PathLike) -> Path:
    """``path`` with its symbolic links followed (a dangling link gives its target); a link loop
    raises :class:`OutputPathError`."""
    p = Path(path)
    for _ in range(_MAX_LINKS):
        try:
            if not p.is_symlink():
                return p
            target = Path(os.readlink(p))
        except OSError as e:
            raise OutputPathError(f"output {path}: {_why(e)}") from None
        p = target if target.is_absolute() else p.parent / target
    raise OutputPathError(f"output {path}: too many levels of symbolic links")


def _kind(p: Path) -> str:
    """'missing', 'below-file', 'regular', 'fifo', 'chardev', 'dir' or 'other'."""
    try:
        mode = p.stat().st_mode
    except FileNotFoundError:
        return "missing"
    except NotADirectoryError:
        return "below-file"
    kinds = ((stat.S_ISREG, "regular"), (stat.S_ISFIFO, "fifo"), (stat.S_ISCHR, "chardev"),
             (stat.S_ISDIR, "dir"))
    return next((kind for test, kind in kinds if test(mode)), "other")


def check_output(path: str | os.PathLike) -> Path:
    """Refuse, before any work, an output path that cannot be written by the rules of this module;
    return the path that will be written (links followed). Writes nothing."""
    shown = Path(path)
    text = os.fsdecode(os.fspath(path))
    if text == "":
        raise OutputPathError("output path is empty; give a file name")
    real = resolve_output(path)
    kind = _kind(real)
    via = f" (a link to {real})" if real != shown else ""
    if kind == "dir":
        raise OutputPathError(f"output {text}{via} is a folder; give a file name")
    if text.endswith(tuple(s for s in (os.sep, os.altsep) if s)):  # Path() drops the separator: look first
        if kind in ("missing", "below-file"):
            raise OutputPathError(f"output {text} names a folder that does not exist; give a file name")
        raise OutputPathError(f"output {text} names a folder, but {shown} is a file; give a file name "
                              "without the trailing separator")
    if kind == "other":
        raise OutputPathError(f"output {shown}{via} is a block device or socket; refusing to write there")
    if kind in ("fifo", "chardev"):
        if not os.access(real, os.W_OK):
            raise OutputPathError(f"output {shown}{via} cannot be written: permission denied")
        if kind == "fifo":
            _hold_fifo(real, shown)
        return real
    parent = real.parent if str(real.parent) else Path(".")
    for up in (parent, *parent.parents):
        if up.exists():
            if not up.is_dir():
                raise OutputPathError(f"output {shown}{via}: {up} is a file, not a folder")
            break
    if not parent.is_dir():
        raise OutputPathError(f"output {shown}{via}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputPathError(f"output {shown}{via} cannot be written: folder {parent} is not writable")
    if kind == "regular" and not os.access(real, os.W_OK):
        raise OutputPathError(f"output {shown}{via} cannot be written: the file is read-only")
    return real


def _fifo_key(real: Path) -> tuple[int, int]:
    st = os.stat(real)
    return st.st_dev, st.st_ino


def _hold_fifo(real: Path, shown: Path) -> None:
    """Open the FIFO ``real`` for writing now (once) and hold it until :func:`_write_into`."""
    key = _fifo_key(real)
    if key in _held_fifos:
        return
    try:  # with no reader, opening would block forever: ask without blocking
        fd = os.open(real, os.O_WRONLY | getattr(os, "O_NOCTTY", 0) | os.O_NONBLOCK)
    except OSError as e:
        if e.errno == errno.ENXIO:
            raise OutputPathError(f"output {shown} is a FIFO with no process reading it; start the reader "
                                  "first") from None
        raise OutputPathError(f"output {shown} cannot be written: {_why(e)}") from None
    os.set_blocking(fd, True)
    _held_fifos[key] = fd


def release_outputs() -> None:
    """Close the FIFOs :func:`check_output` holds open for a write that is not coming."""
    while _held_fifos:
        os.close(_held_fifos.popitem()[1])


def _write_into(real: Path, shown: Path, data: bytes) -> None:
    """Write ``data`` into a FIFO or character device, never replacing it."""
    flags = os.O_WRONLY | getattr(os, "O_NOCTTY", 0)
    if _kind(real) == "fifo":
        _hold_fifo(real, shown)
        fd = _held_fifos.pop(_fifo_key(real))
    else:
        try:
            fd = os.open(real, flags)
        except OSError as e:
            raise OutputPathError(f"output {shown} cannot be written: {_why(e)}") from None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except OSError as e:
        if e.errno == errno.EPIPE:
            raise OutputPathError(f"output {shown}: the reader closed it before the end") from None
        raise OutputPathError(f"output {shown} cannot be written: {_why(e)}") from None
    finally:
        os.close(fd)


def _umask() -> int:
    """This process's umask, read from ``/proc/self/status`` where it can be (without changing it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and put back (not thread-safe, but only where /proc lacks it)
    os.umask(mask)
    return mask


def _take_over_metadata(tmp: Path, real: Path) -> None:
    """Give ``tmp`` the mode (and, where allowed, owner and group) of the file it replaces, or ``0666``
    less the umask for a new file."""
    try:
        old = os.stat(real)
    except FileNotFoundError:
        old = None
    if old is None or not stat.S_ISREG(old.st_mode):
        os.chmod(tmp, 0o666 & ~_umask())
        return
    mine = os.stat(tmp)
    if (mine.st_uid, mine.st_gid) != (old.st_uid, old.st_gid):
        try:  # before chmod: a change of owner clears the set-user-ID and set-group-ID bits
            os.chown(tmp, old.st_uid, old.st_gid)
        except PermissionError:
            try:  # not root: the group may still be one of this user's
                os.chown(tmp, -1, old.st_gid)
            except PermissionError:
                pass
    os.chmod(tmp, stat.S_IMODE(old.st_mode))


@contextmanager
def output_file(path: str | os.PathLike) -> Iterator[Path]:
    """A temporary path (with ``path``'s suffix) to write into; on a clean exit it becomes ``path`` by
    the rules of this module, on an exception it is removed and ``path`` is untouched::

        with output_file(out / "fig.png") as tmp:
            fig.savefig(tmp)
    """
    shown = Path(path)
    real = check_output(path)
    special = _kind(real) in ("fifo", "chardev")
    if special:  # never a temporary file beside a device (e.g. in /dev): use the temp folder
        fd, name = tempfile.mkstemp(prefix=".repro-", suffix=real.suffix[:16])
        os.close(fd)
        tmp = Path(name)
    else:
        tmp = real.parent / f".repro-{uuid.uuid4().hex[:8]}.tmp{real.suffix[:16]}"
    try:
        yield tmp
        if special:
            _write_into(real, shown, tmp.read_bytes())
        else:
            try:
                _take_over_metadata(tmp, real)
                os.replace(tmp, real)
            except OSError as e:
                raise OutputPathError(f"output {shown} cannot be written: {_why(e)}") from None
    finally:
        tmp.unlink(missing_ok=True)


def write_output(path: str | os.PathLike, content: str | bytes, *, encoding: str = "utf-8") -> Path:
    """Write ``content`` at ``path`` by the rules of this module; return the path written (links
    followed). Raises :class:`OutputPathError` (one line) when it cannot."""
    data = content.encode(encoding) if isinstance(content, str) else bytes(content)
    real = check_output(path)
    if _kind(real) in ("fifo", "chardev"):
        _write_into(real, Path(path), data)
        return real
    with output_file(path) as tmp:
        try:
            tmp.write_bytes(data)
        except OSError as e:
            raise OutputPathError(f"output {path} cannot be written: {_why(e)}") from None
    return real


class InputPathError(ValueError):
    """A JSON input file (plan, cost model) that cannot be read; the message is one line naming it."""


def read_input(kind: str, path: str | os.PathLike, load: Callable[[Path], Any]) -> Any:
    """``load(path)`` of a ``kind`` JSON file (``"plan"``, ``"cost model"``); a folder, a device,
    non-UTF-8 bytes, absurd nesting and an unreadable file raise :class:`InputPathError` naming it."""
    p = Path(path)
    if p.is_dir():
        raise InputPathError(f"{kind} {p} is a folder, not a {kind} file")
    if p.exists() and not p.is_file():
        raise InputPathError(f"{kind} {p} is not a regular file (a device, pipe or socket)")
    try:
        return load(p)
    except RecursionError:
        raise InputPathError(f"{p}: {kind} JSON is nested too deeply to be a {kind}") from None
    except UnicodeDecodeError as e:
        raise InputPathError(f"{p}: a {kind} file is UTF-8 JSON text, but byte {e.start} is not UTF-8") from None
    except PermissionError as e:
        raise InputPathError(f"{p}: cannot be read: {e.strerror}") from None
