"""The one reader of files a user names: configs, JSON, YAML, prompts, DeepSpeed configs.

Every file the plugin reads from a path it was given goes through here, so every reader gets
the same guarantees, each failure a one-line ``PrecisionConfigError`` naming the option and the
path:

- the path is checked against the OS's own limits before anything touches it
  (:func:`check_path`: no NUL byte, no name over ``NAME_MAX`` bytes, not over ``PATH_MAX``);
- only a regular file is opened: a folder, a named pipe (which would block the reader for ever),
  a device (``/dev/zero`` never ends) or a socket is refused from ``os.stat`` alone
  (:func:`regular_file`), and the file's size is held to a limit (:data:`MAX_CONFIG_BYTES`,
  :data:`MAX_DATA_BYTES`), both before opening and while reading;
- text is UTF-8, and a byte that is not names its offset (:func:`read_text`);
- JSON refuses a key given twice (:func:`parse_json`), YAML goes through a loader that counts
  nodes with every alias expanded and refuses past :data:`MAX_NODES` (a "billion laughs" file
  is refused after composing a hundred nodes), refuses an anchor used inside itself and a key
  that is a list or a mapping (:func:`yaml_loader`);
- every structure read is walked once without recursion for depth, cycles and size
  (:func:`check_tree`), so nothing that walks it later can recurse for ever.

The checked writer is :mod:`precision_plugin._base.outputs`; it checks its paths with
:func:`check_path` too.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from collections.abc import Mapping
from typing import Any

from precision_plugin.errors import PrecisionConfigError

#: A config file (YAML or JSON: verl, AReaL, slime, SGLang, DeepSpeed, a checkpoint's
#: config.json) larger than this is refused unread. verl's full generated config is about
#: 40 KB; 4 MiB is a hundred times that, and PyYAML parses it in seconds.
MAX_CONFIG_BYTES = 4 * 2**20

#: A data file (a prompts file) larger than this is refused unread.
MAX_DATA_BYTES = 256 * 2**20

#: How deep a structure read from a user's file may nest. The deepest the plugin reads is a chat
#: prompt (a list of messages in an object in a list: 4); a DeepSpeed config nests 3. Deeper is
#: no config, and Python's recursion limit would end reading it in a RecursionError.
MAX_DEPTH = 64

#: The node budget of a structure read or walked: YAML nodes with every alias expanded, or the
#: values of a JSON document or mapping. A config has a few thousand; a "billion laughs" file
#: (9 levels of 10 aliases) expands to 10**9.
MAX_NODES = 1_000_000

#: ``NAME_MAX`` and ``PATH_MAX`` where ``os.pathconf`` cannot tell (Linux's values).
_NAME_MAX, _PATH_MAX = 255, 4096

_KINDS = (
    (stat.S_ISFIFO, "a named pipe (FIFO), which would block the reader until something writes"),
    (stat.S_ISCHR, "a character device, not a file"),
    (stat.S_ISBLK, "a block device, not a file"),
    (stat.S_ISSOCK, "a socket, not a file"),
)


class UserDataError(PrecisionConfigError):
    """Data a user wrote that parses but is refused (callers say which file or option)."""


#: The name JSON callers know (``precision_plugin.policy.UserJSONError``).
UserJSONError = UserDataError


class DuplicateKeyError(UserDataError):
    """A JSON object names one key twice (raised by :func:`parse_json`)."""


class TooDeepError(UserDataError):
    """Data nested deeper than :data:`MAX_DEPTH`."""


class TooLargeError(UserDataError):
    """Data holding more than :data:`MAX_NODES` nodes (YAML aliases expanded)."""


class CycleError(UserDataError):
    """A mapping or list that contains itself (a YAML anchor used inside itself)."""


class KeyKindError(UserDataError):
    """A YAML mapping key that is a list or a mapping (no program reads such a key)."""


def _refuse(what: str, shown: str, problem: str) -> PrecisionConfigError:
    return PrecisionConfigError(f"{what} {shown} {problem}")


def _limit(folder: str, name: str, default: int) -> int:
    """``os.pathconf(folder, name)``, or ``default`` where the system cannot tell."""
    try:
        value = os.pathconf(folder, name)
    except (OSError, ValueError):
        return default
    return value if value and value > 0 else default


def _existing_ancestor(path: str) -> str:
    folder = os.path.dirname(os.path.abspath(path))
    while folder and not os.path.isdir(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return folder or os.sep


def shown(path: Any) -> str:
    """``path`` as messages show it: ``repr`` of the text, cut in the middle past 120 chars."""
    text = os.fspath(path) if isinstance(path, (str, os.PathLike)) else str(path)
    text = text if isinstance(text, str) else os.fsdecode(text)
    if len(text) > 120:
        return f"{text[:60] + '...' + text[-40:]!r} ({len(text)} characters)"
    return repr(text)


def check_path(path: str | os.PathLike[str], what: str) -> str:
    """``path`` as a string with ``~`` expanded, once it is known the OS can take it: not empty,
    no NUL byte, encodable, no component longer than the file system's ``NAME_MAX`` bytes, the
    whole not over ``PATH_MAX``. ``what`` names the option or parameter in the message."""
    if not isinstance(path, (str, os.PathLike)):
        raise PrecisionConfigError(
            f"{what}: expected a file path (str or os.PathLike), got {type(path).__name__}."
        )
    raw = os.fspath(path)
    text = raw if isinstance(raw, str) else os.fsdecode(raw)
    name = shown(text)
    if not text.strip():
        raise PrecisionConfigError(f"{what}: the path is empty; pass a file path.")
    if "\0" in text:
        raise _refuse(
            what,
            name,
            "holds a NUL byte (\\x00), which no file name holds; pass the path without it.",
        )
    full = os.path.expanduser(text)
    try:
        encoded = os.fsencode(full)
    except UnicodeEncodeError as exc:
        raise _refuse(
            what,
            name,
            f"holds {exc.object[exc.start]!r}, which no file name can be written "
            f"with; pass the path without it.",
        ) from None
    folder = _existing_ancestor(full)
    name_max = _limit(folder, "PC_NAME_MAX", _NAME_MAX)
    for part in encoded.split(b"/"):
        if len(part) > name_max:
            part_shown = shown(os.fsdecode(part))
            raise _refuse(
                what,
                name,
                f"has a name {len(part)} bytes long ({part_shown}), over the file "
                f"system's limit of {name_max} bytes per name; pass a shorter name.",
            )
    path_max = _limit(folder, "PC_PATH_MAX", _PATH_MAX)
    if len(encoded) >= path_max:
        raise _refuse(
            what,
            name,
            f"is {len(encoded)} bytes long, over the system's limit of "
            f"{path_max - 1} bytes per path; pass a shorter path.",
        )
    return full


def regular_file(
    path: str | os.PathLike[str], what: str, limit: int = MAX_CONFIG_BYTES
) -> os.stat_result:
    """The ``os.stat`` of ``path`` once it is known to be a regular file (links followed) of at
    most ``limit`` bytes; nothing is opened. Refuses a missing path, a folder, a named pipe, a
    device or a socket, each in one line naming ``what`` and the path."""
    full = check_path(path, what)
    name = shown(path)
    try:
        info = os.stat(full)
    except FileNotFoundError:
        if os.path.islink(full):
            raise _refuse(
                what, name, "is a link to nothing; pass the file it should name."
            ) from None
        raise _refuse(what, name, "does not exist; pass the path of an existing file.") from None
    except NotADirectoryError:
        raise _refuse(
            what, name, "does not exist (a part of it is a file, not a folder); check the path."
        ) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(what, name, "is a loop of links; pass the file itself.") from None
        raise _refuse(
            what,
            name,
            f"cannot be read ({exc.strerror or exc}); check the path and its permissions.",
        ) from None
    if stat.S_ISDIR(info.st_mode):
        raise _refuse(what, name, "is a folder, not a file; pass the path of the file inside it.")
    for test, kind in _KINDS:
        if test(info.st_mode):
            raise _refuse(what, name, f"is {kind}; pass the path of a regular file.")
    if info.st_size > limit:
        raise _refuse(
            what,
            name,
            f"is {info.st_size:,} bytes, over the limit of {limit:,} bytes for such "
            f"a file; pass the right file (or split it).",
        )
    return info


def _open_regular(full: str, what: str, name: str) -> int:
    """A read-only descriptor of ``full`` (already :func:`regular_file`), opened without
    blocking and checked again once open."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(full, flags)
    except OSError as exc:
        raise _refuse(
            what,
            name,
            f"cannot be read ({exc.strerror or exc}); check the path and its permissions.",
        ) from None
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        regular = False
    if not regular:  # replaced between the stat and the open
        os.close(fd)
        raise _refuse(what, name, "changed into something that is not a file; pass a file.")
    return fd


def read_head(path: str | os.PathLike[str], what: str, size: int) -> bytes:
    """The first ``size`` bytes (fewer in a shorter file) of the regular file ``path`` of any
    size (a model file's magic bytes); refused as :func:`regular_file` refuses."""
    full = check_path(path, what)
    regular_file(full, what, limit=2**63 - 1)
    name = shown(path)
    fd = _open_regular(full, what, name)
    try:
        return os.read(fd, size)
    except OSError as exc:
        raise _refuse(what, name, f"cannot be read ({exc.strerror or exc}).") from None
    finally:
        os.close(fd)


def read_bytes(path: str | os.PathLike[str], what: str, limit: int = MAX_CONFIG_BYTES) -> bytes:
    """The contents of the regular file ``path`` (see :func:`regular_file`), at most ``limit``
    bytes; the file is opened without blocking and checked again once open."""
    full = check_path(path, what)
    regular_file(full, what, limit)
    name = shown(path)
    fd = _open_regular(full, what, name)
    try:
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        raise _refuse(what, name, f"cannot be read ({exc.strerror or exc}).") from None
    finally:
        os.close(fd)
    if size > limit:
        raise _refuse(
            what,
            name,
            f"holds more than the limit of {limit:,} bytes for such a file; pass "
            f"the right file (or split it).",
        )
    return b"".join(chunks)


def read_text(
    path: str | os.PathLike[str], what: str, limit: int = MAX_CONFIG_BYTES, *, bom: bool = False
) -> str:
    """The UTF-8 text of the regular file ``path`` (see :func:`read_bytes`); a byte that is not
    UTF-8 is refused with its value and offset. ``bom``: drop a leading UTF-8 byte-order mark."""
    data = read_bytes(path, what, limit)
    try:
        return data.decode("utf-8-sig" if bom else "utf-8")
    except UnicodeDecodeError as exc:
        raise _refuse(
            what,
            shown(path),
            f"is not UTF-8 text (byte {data[exc.start]:#04x} at offset "
            f"{exc.start}); save it as UTF-8.",
        ) from None


def check_tree(data: Any, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> None:
    """Walk ``data`` (mappings, lists and tuples) once, without recursion: a container that
    contains itself is a :class:`CycleError`, nesting deeper than ``max_depth`` a
    :class:`TooDeepError`, more than ``max_nodes`` values (shared ones counted each time) a
    :class:`TooLargeError`. The messages say what was found; callers say where."""
    stack: list[tuple[Any, int, bool]] = [(data, 1, False)]
    on_path: set[int] = set()
    count = 0
    while stack:
        node, depth, leaving = stack.pop()
        if leaving:
            on_path.discard(id(node))
            continue
        count += 1
        if count > max_nodes:
            raise TooLargeError(
                f"holds more than {max_nodes:,} values (shared ones counted each time they are "
                f"used), which no configuration does; write it out plainly"
            )
        if not isinstance(node, (Mapping, list, tuple)):
            continue
        if id(node) in on_path:
            raise CycleError(
                f"holds a {'mapping' if isinstance(node, Mapping) else 'list'} that contains "
                f"itself, which has no end; write the values out"
            )
        if depth > max_depth:
            raise TooDeepError(
                f"nests deeper than {max_depth} levels, which no configuration or prompt does "
                f"(the deepest the plugin reads nests 4); write it flat"
            )
        on_path.add(id(node))
        stack.append((node, depth, True))
        items = node.values() if isinstance(node, Mapping) else node
        stack.extend((item, depth + 1, False) for item in items)


def check_argument(data: Any, what: str) -> None:
    """:func:`check_tree` for a structure passed to a public function (not read from a file):
    a cycle, nesting past :data:`MAX_DEPTH` or more than :data:`MAX_NODES` values is a one-line
    ``PrecisionConfigError`` that starts with ``what``, which names the parameter as its caller
    spells it (``"DeepSpeed config (cfg, a dict)"``), so the user knows which argument it is."""
    try:
        check_tree(data)
    except UserDataError as exc:
        raise PrecisionConfigError(f"{what}: {exc}.") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(
                f"the key {key!r} appears twice in one JSON object ({out[key]!r} and then "
                f"{value!r}), and a JSON reader would keep only the last one, silently: keep one"
            )
        out[key] = value
    return out


def parse_json(text: str) -> Any:
    """``json.loads`` for JSON a user wrote (the ``PRECISION_PLUGIN`` object, a DeepSpeed
    config, a prompts file): a key given twice in one object is a :class:`DuplicateKeyError`
    instead of the last one winning; JSON nested deeper than :data:`MAX_DEPTH` is a
    :class:`TooDeepError`, never a ``RecursionError``. Malformed JSON is ``json``'s own
    ``JSONDecodeError`` (callers name the file and the position)."""
    try:
        data = json.loads(text, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise TooDeepError(
            f"nests deeper than {MAX_DEPTH} levels, which no configuration or prompt does "
            f"(the deepest the plugin reads nests 4); write it flat"
        ) from None
    check_tree(data)
    return data


def yaml_loader(base: type | None = None) -> type:
    """A subclass of the YAML loader ``base`` (PyYAML's ``SafeLoader`` by default; a program's
    own loader, such as OmegaConf's, where the reader follows that program) that keeps its
    rules and refuses, while composing: a document past :data:`MAX_NODES` nodes with every
    alias expanded (:class:`TooLargeError`), nesting deeper than :data:`MAX_DEPTH`
    (:class:`TooDeepError`), an anchor used inside itself (:class:`CycleError`) and a mapping
    key that is a list or a mapping (:class:`KeyKindError`)."""
    import yaml

    loader = base if base is not None else yaml.SafeLoader

    class Budgeted(loader):  # type: ignore[misc, valid-type]
        def __init__(self, stream: Any) -> None:
            super().__init__(stream)
            self._sizes: dict[int, int] = {}
            self._open_anchors: list[str | None] = []

        def compose_node(self, parent: Any, index: Any) -> Any:
            event = self.peek_event()
            line = event.start_mark.line + 1 if event.start_mark else 0
            if isinstance(event, yaml.AliasEvent):
                if event.anchor in self._open_anchors:
                    raise CycleError(
                        f"uses the anchor &{event.anchor} inside itself (line {line}): a mapping "
                        f"that contains itself has no end; write the values out"
                    )
                node = super().compose_node(parent, index)
                return node
            if len(self._open_anchors) >= MAX_DEPTH:
                raise TooDeepError(
                    f"nests deeper than {MAX_DEPTH} levels (line {line}), which no configuration "
                    f"does; write it flat"
                )
            self._open_anchors.append(getattr(event, "anchor", None))
            try:
                node = super().compose_node(parent, index)
            finally:
                self._open_anchors.pop()
            size = 1
            if isinstance(node, yaml.SequenceNode):
                size += sum(self._sizes.get(id(child), 1) for child in node.value)
            elif isinstance(node, yaml.MappingNode):
                size += sum(
                    self._sizes.get(id(key), 1) + self._sizes.get(id(value), 1)
                    for key, value in node.value
                )
            if size > MAX_NODES:
                raise TooLargeError(
                    f"expands to more than {MAX_NODES:,} values through its aliases (the node "
                    f"ending at line {node.end_mark.line + 1}), an alias bomb, not a "
                    f"configuration; write the values out without nested aliases"
                )
            self._sizes[id(node)] = size
            return node

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            for key, _ in node.value:
                if not isinstance(key, yaml.ScalarNode):
                    kind = "list" if isinstance(key, yaml.SequenceNode) else "mapping"
                    raise KeyKindError(
                        f"uses a {kind} as a key (line {key.start_mark.line + 1}), which no "
                        f"program's setting is named by; write the key as a plain name"
                    )
            return super().construct_mapping(node, deep=deep)

    Budgeted.__name__ = Budgeted.__qualname__ = f"Budgeted{loader.__name__}"
    return Budgeted


def parse_yaml(text: str, loader: type | None = None) -> Any:
    """The YAML document ``text`` read by :func:`yaml_loader` of ``loader`` and walked by
    :func:`check_tree`. Malformed YAML is PyYAML's own ``YAMLError`` (callers name the file)."""
    import yaml

    budgeted = yaml_loader(loader)
    try:
        data = yaml.load(text, Loader=budgeted)  # a SafeLoader subclass
    except RecursionError:
        raise TooDeepError(
            f"nests deeper than {MAX_DEPTH} levels, which no configuration does; write it flat"
        ) from None
    check_tree(data)
    return data


def _data_error(what: str, path: Any, exc: UserDataError, note: str = "") -> PrecisionConfigError:
    sep = ": " if isinstance(exc, DuplicateKeyError) else " "  # its message names the key first
    return PrecisionConfigError(f"{what} {shown(path)}{sep}{exc}{note}.")


def read_json(
    path: str | os.PathLike[str], what: str, limit: int = MAX_CONFIG_BYTES, *, note: str = ""
) -> Any:
    """The JSON file ``path`` read by :func:`read_text` and :func:`parse_json`; every failure a
    ``PrecisionConfigError`` naming ``what`` and the path (``note`` is added to the message of
    data that parses but is refused)."""
    text = read_text(path, what, limit)
    try:
        return parse_json(text)
    except UserDataError as exc:
        raise _data_error(what, path, exc, note) from None
    except json.JSONDecodeError as exc:
        raise _refuse(
            what,
            shown(path),
            f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno}); fix the file.",
        ) from None


def read_yaml(
    path: str | os.PathLike[str],
    what: str,
    loader: type | None = None,
    limit: int = MAX_CONFIG_BYTES,
) -> Any:
    """The YAML file ``path`` read by :func:`read_text` and :func:`parse_yaml` (``loader``: the
    program's own YAML loader, PyYAML's ``SafeLoader`` by default); every failure a
    ``PrecisionConfigError`` naming ``what`` and the path."""
    import yaml

    text = read_text(path, what, limit)
    try:
        return parse_yaml(text, loader)
    except UserDataError as exc:
        raise _data_error(what, path, exc) from None
    except yaml.YAMLError as exc:
        detail = " ".join(str(exc).split())
        raise _refuse(what, shown(path), f"is not valid YAML ({detail}); fix the file.") from None
