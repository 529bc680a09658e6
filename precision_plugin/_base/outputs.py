"""The one checked writer: what a command produces is written atomically, to distinct paths that
were checked before any work, and the loss of an output the user asked for is noticed.

- :func:`check_output_path` refuses, before the run, a path the OS cannot take (a NUL byte, a
  name over ``NAME_MAX`` bytes, a path over ``PATH_MAX``:
  :func:`precision_plugin._base.userfiles.check_path`), a folder, a folder that does not exist or
  cannot be written, and an image extension matplotlib cannot write; one line each, naming
  the option.
- :func:`write_atomic` (text) and :func:`write_with` (anything a function writes to a path, such
  as a figure) write through a temporary file beside the target and a rename, so a crash, a
  full disk or Ctrl-C leaves the old file or the new one, never half of one; both check the
  path first, and an OS error is one line naming the option.
- :func:`distinct_paths` refuses, before any work, an output path that is one of the inputs (it
  would be overwritten) or another output (one would overwrite the other).
- :func:`console` is a rich console whose broken pipe (``precision-plugin probe | head -c 10``)
  is an ``OSError`` the command line turns into its one-line "output lost" error (exit 74),
  not rich's own silent ``SystemExit(1)``.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from precision_plugin._base.userfiles import check_path
from precision_plugin.errors import PrecisionConfigError

#: The path that means standard output (``--json -``).
STDOUT = "-"


def check_output_path(path: str | None, option: str, formats: Sequence[str] = ()) -> None:
    """Refuse an output path the run could not write, before the run (not after it): one
    ``PrecisionConfigError`` line naming ``option``. ``None`` (not asked) passes, and ``-``
    (stdout) unless ``formats`` (the image formats a figure may take) is given."""
    if path is None or (path == STDOUT and not formats):
        return
    if not str(path).strip():
        example = "probe.png" if formats else "results.json ('-' for stdout)"
        raise PrecisionConfigError(
            f"{option}: the path is empty; pass a file path such as {example}"
        )
    target = Path(check_path(path, option))
    if target.is_dir():
        raise PrecisionConfigError(f"{option}: {path!r} is a folder; pass a file path inside it")
    if target.exists() and not target.is_file() and not formats:
        # A device or a named pipe (/dev/null, /dev/stdout) is written in place: only the
        # target itself must be writable, whatever its folder (/dev, /proc/self/fd) allows.
        if not os.access(target, os.W_OK):
            raise PrecisionConfigError(
                f"{option}: cannot write {path!r}: no write permission for it; pass a path you "
                f"can write"
            )
        return
    parent = target.resolve().parent
    if parent.exists() and not parent.is_dir():
        raise PrecisionConfigError(
            f"{option}: cannot write {path!r}: {str(parent)!r} is a file, not a folder; pass "
            f"another path"
        )
    if not parent.is_dir():
        raise PrecisionConfigError(
            f"{option}: cannot write {path!r}: folder {str(parent)!r} does not exist; create it "
            f"or pass another path"
        )
    if not os.access(parent, os.W_OK | os.X_OK) or (
        target.exists() and not os.access(target, os.W_OK)
    ):
        where = str(target) if target.exists() else f"folder {str(parent)!r}"
        raise PrecisionConfigError(
            f"{option}: cannot write {path!r}: no write permission for {where}; pass a path "
            f"you can write"
        )
    if not target.exists():
        _check_creatable(path, option, parent)
    suffix = target.suffix.lower().lstrip(".")
    if formats and suffix not in formats:
        raise PrecisionConfigError(
            f"{option}: cannot write {path!r}: {suffix or 'no'} extension is not an image format "
            f"matplotlib writes; use .png (or one of {', '.join(sorted(formats))})"
        )


def _check_creatable(path: str, option: str, folder: Path) -> None:
    """Refuse a folder where no file can be created (``/proc``, a read-only mount), which the
    permission bits do not show: by creating and removing a temporary file there."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".precision-plugin-check."):
            pass
    except OSError as exc:
        raise PrecisionConfigError(
            f"{option}: cannot write {path!r}: no file can be created in folder "
            f"{str(folder)!r} ({exc.strerror or exc}); pass a path in another folder"
        ) from None


def write_atomic(path: str | os.PathLike[str], text: str, option: str = "output") -> Path:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file in the same folder and a
    rename; the temporary file is removed when anything fails. Returns the path.

    A link is written through (the file it points to is replaced, the link kept); the file
    keeps its permissions, and a new one gets the usual ones (0666 less the umask), not the
    temporary file's 0600. Something that exists and is not a regular file (``/dev/null``,
    ``/dev/stdout``, a named pipe) is written in place: a rename would replace the device or
    the pipe with a file. A path the OS cannot take is refused first, naming ``option``."""

    def put(handle_path: Path) -> None:
        with open(handle_path, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            if not _special(handle_path):
                os.fsync(handle.fileno())

    return write_with(path, option, put, check=False)


def write_with(
    path: str | os.PathLike[str],
    option: str,
    write_to: Callable[[Path], Any],
    *,
    check: bool = True,
) -> Path:
    """Have ``write_to(temporary)`` write the output (a figure, a file of any kind), then rename
    the temporary file (beside the target, with its suffix) onto ``path``, as
    :func:`write_atomic` does; the path is checked first (:func:`check_path`; with ``check``
    also :func:`check_output_path`), and an OS error is a ``PrecisionConfigError`` naming
    ``option``. Returns the path."""
    if check:
        check_output_path(os.fspath(path), option)
    target = Path(check_path(path, option))
    try:
        return _write_replacing(target, write_to)
    except OSError as exc:
        raise PrecisionConfigError(
            f"{option}: cannot write {os.fspath(path)!r}: {exc.strerror or exc}; pass a path "
            f"in a folder that exists and is writable, on a disk with room"
        ) from None


def _write_replacing(target: Path, write_to: Callable[[Path], Any]) -> Path:
    if _special(target):
        write_to(target)
        return target
    if target.is_symlink():
        target = target.resolve()
    if target.exists():
        mode = target.stat().st_mode & 0o7777
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, temporary = tempfile.mkstemp(
        prefix=f".{target.stem[:32]}.", suffix=f".tmp{target.suffix[:16]}", dir=target.parent
    )
    os.close(fd)
    try:
        write_to(Path(temporary))
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target


def _special(path: Path) -> bool:
    """Whether ``path`` (followed through links) exists and is not a regular file or folder."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode))


def _key(path: str) -> Path:
    resolved = Path(path).expanduser()
    try:
        return resolved.resolve()
    except (OSError, RuntimeError):  # a loop of links: compare as written
        return resolved.absolute()


def distinct_paths(inputs: Mapping[str, Any], outputs: Mapping[str, Any]) -> None:
    """Refuse an output path that equals an input path or another output path (after
    resolving ``~``, ``..`` and links), naming both options; ``None`` and ``-`` (stdout) are
    skipped. Raises [`PrecisionConfigError`][precision_plugin.errors.PrecisionConfigError]."""
    seen: dict[Path, str] = {}
    for option, value in inputs.items():
        if value not in (None, STDOUT):
            seen.setdefault(_key(str(value)), option)
    for option, value in outputs.items():
        if value in (None, STDOUT):
            continue
        key = _key(str(value))
        if key in seen:
            other = seen[key]
            kind = "input" if other in inputs else "output"
            raise PrecisionConfigError(
                f"{option} {value!r} is the same file as the {kind} {other}: writing it would "
                f"{'destroy the input' if kind == 'input' else 'overwrite the other output'} "
                f"before the run ends; give {option} a path of its own."
            )
        seen[key] = option


def console(stderr: bool = False, **kwargs: Any) -> Any:
    """A ``rich.console.Console`` whose broken pipe raises ``BrokenPipeError`` (an ``OSError``)
    instead of rich's ``SystemExit(1)``, so the command can say the output was lost."""
    from rich.console import Console

    class _Console(Console):
        def on_broken_pipe(self) -> None:
            """The reader of the pipe has gone: an error the command names (exit 74)."""
            raise BrokenPipeError(errno.EPIPE, "Broken pipe (the reader of the output has gone)")

    return _Console(stderr=stderr, **kwargs)
