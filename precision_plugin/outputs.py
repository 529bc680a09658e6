"""Writing what a command produces: atomically, to distinct paths, and noticing when the output
the user asked for is lost.

- :func:`write_atomic` writes a file through a temporary file beside it and a rename, so a
  crash, a full disk or Ctrl-C leaves the old file or the new one, never half of one.
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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from precision_plugin.errors import PrecisionConfigError

#: The path that means standard output (``--json -``).
STDOUT = "-"


def write_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file in the same folder and a
    rename; the temporary file is removed when anything fails. Returns the path.

    A link is written through (the file it points to is replaced, the link kept); the file
    keeps its permissions, and a new one gets the usual ones (0666 less the umask), not the
    temporary file's 0600. Something that exists and is not a regular file (``/dev/null``,
    ``/dev/stdout``, a named pipe) is written in place: a rename would replace the device or
    the pipe with a file."""
    target = Path(path).expanduser()
    if _special(target):
        with open(target, "w", encoding="utf-8") as handle:
            handle.write(text)
        return target
    if target.is_symlink():
        target = target.resolve()
    if target.exists():
        mode = target.stat().st_mode & 0o7777
    else:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
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
