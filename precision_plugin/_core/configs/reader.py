"""The one strict reader of other programs' configs: a :class:`Dialect` per program.

A dialect holds the keys the plugin reads from that program (each with its kind, its choices and
its command-line spelling), the pairs the program refuses together, and the family of reader
the program uses (:mod:`precision_plugin._core.configs.values`). Reading:

- parses every known key the way the program does, or refuses what it would refuse;
- reports a key that is not known but is close to a known one as a typo, with the nearest known
  key (``difflib``): a misspelt precision key is otherwise silently ignored by the check *and*
  refused (or ignored) by the program. A key far from every known one is left alone, since each
  program has many settings the plugin does not read;
- refuses a flag given without its value, and the pairs the program refuses;
- names the source (a file, "the command line", "the parsed arguments") and the key path in
  every message: ``verl: actor_rollout_ref.rollout.dtype in ppo.yaml is ...``.

Errors are [`PrecisionConfigError`][precision_plugin.errors.PrecisionConfigError].
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, is_dataclass
from typing import Any

from precision_plugin._base import userfiles
from precision_plugin._base.boundary import Invalid, Validator, checked, fix_hint, non_empty, one_of
from precision_plugin._core.configs import values as v
from precision_plugin.errors import PrecisionConfigError

#: How close an unknown key's last part must be to a known sibling's to be reported as its
#: typo (``difflib`` ratio; ``dtpye`` and ``dtype`` are 0.8). Only siblings are compared: a
#: long shared prefix makes every path close to every other.
TYPO_CUTOFF = 0.8
_MISSING: Any = object()


def _config(value: Any) -> Any:
    if isinstance(value, (str, bytes)) or not (
        isinstance(value, Mapping) or hasattr(value, "__dict__") or _is_omegaconf(value)
    ):
        raise Invalid(
            "is not a configuration (a mapping, an OmegaConf config, a dataclass or the "
            "namespace a parser returned); load the file first, e.g. yaml.safe_load"
        )
    return value


#: A configuration object the reader walks.
CONFIG = Validator("a configuration object", _config, ("x", b"x"))
KINDS = ("switch", "int", "float", "text", "choice", "mapping", "dtype")


@checked(kind=one_of(*KINDS), convert=one_of("text", "int"))
@dataclass(frozen=True)
class Key:
    """One setting a dialect reads: ``path`` (dotted), its ``kind`` and, for ``choice``, the
    values the program accepts (compared after converting with ``convert``)."""

    path: str
    kind: str  # "switch" | "int" | "float" | "text" | "choice" | "mapping" | "dtype"
    choices: tuple[Any, ...] = ()
    convert: str = "text"  # for "choice": the kind of the choices ("text" or "int")
    flag: str | None = None  # the command-line spelling when it is not --<path>
    cite: str = ""  # where the program defines it

    def spelling(self) -> str:
        """The command-line flag of this key."""
        return self.flag or f"--{self.path}"


@checked
@dataclass(frozen=True)
class Pair:
    """Two switches the program refuses together, and why (with the source line)."""

    first: str
    second: str
    why: str


@checked(
    style=one_of(*v.STYLES),
    program=non_empty("the program's name, which starts every message, e.g. 'verl'"),
)
@dataclass(frozen=True)
class Dialect:
    """How one program reads its configuration (see the module docstring)."""

    program: str
    style: str
    keys: tuple[Key, ...]
    pairs: tuple[Pair, ...] = ()
    #: Real settings of the program that are close to a known key but are not typos of it.
    neighbours: frozenset[str] = frozenset()
    #: Flags that take no value (beyond the ``switch`` keys), so that ``--flag --next`` is fine.
    bare_flags: frozenset[str] = frozenset()
    version: str = ""
    by_path: dict[str, Key] = field(init=False, repr=False, compare=False)
    by_flag: dict[str, Key] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_path", {k.path: k for k in self.keys})
        object.__setattr__(self, "by_flag", {k.spelling(): k for k in self.keys})

    @checked(style=one_of(*v.STYLES))
    def with_style(self, style: str) -> Dialect:
        """The same keys read by another family's rules (SGLang's keyword arguments are Python
        values, its command line argparse text)."""
        import dataclasses

        return dataclasses.replace(self, style=style)

    # -- messages ---------------------------------------------------------------------------

    def error(self, path: str, source: str, message: str) -> PrecisionConfigError:
        """A ``PrecisionConfigError`` naming the program, the key path and the source."""
        return PrecisionConfigError(f"{self.program}: {path} in {source} {message}.")

    def typo(self, name: str, known: Sequence[str]) -> str | None:
        """The known key ``name`` is a typo of, or ``None`` (a key the plugin does not read)."""
        if name in known or name in self.neighbours:
            return None
        parent, _, leaf = name.rpartition(".")
        siblings = {k.rpartition(".")[2]: k for k in known if k.rpartition(".")[0] == parent}
        close = difflib.get_close_matches(leaf, list(siblings), n=1, cutoff=TYPO_CUTOFF)
        return siblings[close[0]] if close else None

    # -- values -----------------------------------------------------------------------------

    def value(self, path: str, raw: Any, source: str) -> Any:
        """``raw`` at ``path`` as the program reads it; refused values raise, naming both."""
        key = self.by_path.get(path)
        if key is None or raw is None or key.kind == "dtype":
            return raw  # a dtype is read by the adapter's dtype normalisation
        unresolved = isinstance(raw, str) and (
            raw == "???" or (raw.startswith("${") and raw.endswith("}"))
        )
        if self.style in ("omegaconf", "structured") and unresolved:
            return raw  # a mandatory value not set yet, an interpolation: read when resolved
        try:
            return self._convert(key, raw)
        except v.Refused as exc:
            named = f"{path} ({key.spelling()})" if self.style == "argparse" else path
            raise self.error(named, source, str(exc)) from None

    def _convert(self, key: Key, raw: Any) -> Any:
        if key.kind == "switch":
            return v.as_switch(raw, self.style)
        if key.kind == "int":
            return v.as_int(raw, self.style)
        if key.kind == "float":
            return v.as_float(raw, self.style)
        if key.kind == "mapping":
            return v.as_mapping(raw, self.style)
        if key.kind == "choice":
            value = (
                v.as_int(raw, self.style) if key.convert == "int" else v.as_text(raw, self.style)
            )
            if value not in key.choices:
                shown = ", ".join(str(c) for c in key.choices)
                close = difflib.get_close_matches(str(value), [str(c) for c in key.choices], n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise v.Refused(
                    f"is {value!r}, which {self.program} refuses{hint}: it takes one of {shown}"
                )
            return value
        return v.as_text(raw, self.style)

    # -- readers ----------------------------------------------------------------------------

    @checked(data=CONFIG)
    def read_mapping(self, data: Any, source: str) -> dict[str, Any]:
        """The known keys of ``data`` (nested mappings/objects or dotted keys), each read as the
        program reads it, by dotted path; typos of known keys refused."""
        try:
            flat = flatten(data)
        except userfiles.UserDataError as exc:
            raise PrecisionConfigError(f"{self.program}: {source} {exc}.") from None
        if self.style == "argparse":  # a YAML of flags (SGLang's --config): --kv-cache-dtype
            flat = {path.replace("-", "_"): value for path, value in flat.items()}
        known = list(self.by_path)
        # A dataclass instance is the program's own config object: its fields are settings the
        # program has by definition (verl's RolloutConfig.moe_tensor_parallel_size is no typo of
        # tensor_model_parallel_size), so only what users write in mappings is checked for typos.
        defined = program_defined(data)
        for path in flat:
            if path in defined:
                continue
            near = self.typo(path, known)
            if near is not None:
                raise self.error(
                    path,
                    source,
                    f"is not a setting {self.program} has (did you mean {near!r}?); the check "
                    f"would ignore it, and so would (or worse, refuse) the program",
                )
        for pair in self.pairs:
            a, b = flat.get(pair.first), flat.get(pair.second)
            if (
                a is not None
                and b is not None
                and self._on(pair.first, a, source)
                and self._on(pair.second, b, source)
            ):
                raise self.error(
                    f"{pair.first} and {pair.second}", source, f"are both on: {pair.why}"
                )
        return {
            path: self.value(path, raw, source)
            for path, raw in flat.items()
            if path in self.by_path
        }

    def _on(self, path: str, raw: Any, source: str) -> bool:
        return bool(self.value(path, raw, source))

    @checked(argv=fix_hint("pass sys.argv[1:] of the launch, or shlex.split(command_line)"))
    def read_argv(self, argv: Sequence[str], source: str = "the command line") -> dict[str, Any]:
        """The known flags of a command line, each read as the program's parser reads it: a
        flag missing its value, a typo of a known flag and the refused pairs raise."""
        if isinstance(argv, (str, bytes)) or not all(isinstance(a, str) for a in argv):
            raise PrecisionConfigError(
                f"{self.program}: {source} must be a list of strings (sys.argv[1:] of the "
                f"launch), got {type(argv).__name__}; split it with shlex.split() first"
            )
        out: dict[str, Any] = {}
        flags = list(self.by_flag)
        args = list(argv)
        i = 0
        while i < len(args):
            token = args[i]
            i += 1
            if not token.startswith("--") or token == "--":
                continue
            name, eq, inline = token.partition("=")
            key = self.by_flag.get(name)
            if key is None:
                near = self.typo(name, flags)
                if near is not None:
                    raise self.error(
                        name,
                        source,
                        f"is not a flag {self.program} has (did you mean {near}?); its parser "
                        f"would refuse it or the check would ignore it",
                    )
                continue
            if key.kind == "switch":
                if eq:
                    raise self.error(
                        name, source, f"is a switch and takes no value, got {token!r}; write {name}"
                    )
                out[key.path] = True
                continue
            if eq:
                raw = inline
            elif i < len(args) and not args[i].startswith("--"):  # "--" ends the options
                raw = args[i]
                i += 1
            else:
                raise self.error(
                    name,
                    source,
                    f"has no value (argparse: 'argument {name}: expected one argument'); "
                    f"write {name} VALUE",
                )
            out[key.path] = self.value(key.path, raw, source)
        for pair in self.pairs:
            if out.get(pair.first) and out.get(pair.second):
                first, second = self.by_path[pair.first], self.by_path[pair.second]
                raise self.error(
                    f"{first.spelling()} and {second.spelling()}",
                    source,
                    f"are given together: {pair.why}",
                )
        return out


def _items(data: Any) -> Any:
    """The (key, value) pairs of a config container, or ``None`` for a leaf."""
    if _is_omegaconf(data):  # before Mapping: a DictConfig is one, whose items() resolve
        from omegaconf import OmegaConf

        # unresolved: '???' and '${...}' stay as written (reading them would raise)
        return list(OmegaConf.to_container(data, resolve=False).items())  # type: ignore[union-attr]
    if isinstance(data, Mapping):
        return list(data.items())
    if hasattr(data, "__dataclass_fields__") and not isinstance(data, type):
        return [(name, getattr(data, name, None)) for name in data.__dataclass_fields__]
    if type(data).__module__ in ("argparse", "types") and hasattr(data, "__dict__"):
        return list(vars(data).items())
    return None


def flatten(data: Any) -> dict[str, Any]:
    """A nested config (mappings, OmegaConf containers, namespaces, dataclasses) as
    ``{dotted.path: leaf}``; a mapping's dotted keys are kept as written. Walked without
    recursion, so a config nested thousands of levels deep is read, not a RecursionError; a
    container that holds itself is a ``userfiles.CycleError`` and more than
    ``userfiles.MAX_NODES`` values (shared ones counted each time) a ``userfiles.TooLargeError``,
    never an endless walk."""
    out: dict[str, Any] = {}
    stack: list[tuple[str, Any, bool]] = [("", data, False)]
    on_path: set[int] = set()
    count = 0
    while stack:
        prefix, node, leaving = stack.pop()
        if leaving:
            on_path.discard(id(node))
            continue
        count += 1
        if count > userfiles.MAX_NODES:
            raise userfiles.TooLargeError(
                f"holds more than {userfiles.MAX_NODES:,} values (shared ones counted each time "
                f"they are used), which no configuration does; write it out plainly"
            )
        items = _items(node)
        if items is None or (prefix and not items):
            if prefix:
                out[prefix] = node
            continue
        if id(node) in on_path:
            raise userfiles.CycleError(
                f"holds a container that contains itself (at {prefix!r}), which has no end; "
                f"write the values out"
            )
        on_path.add(id(node))
        stack.append((prefix, node, True))
        for key, value in reversed(items):
            stack.append((f"{prefix}.{key}" if prefix else str(key), value, False))
    return out


def program_defined(data: Any) -> set[str]:
    """The dotted paths of :func:`flatten` that lie inside a dataclass instance (the program's
    own config objects, whose fields exist by definition); walked without recursion."""
    out: set[str] = set()
    stack: list[tuple[str, Any, bool]] = [("", data, False)]
    while stack:
        prefix, node, typed = stack.pop()
        typed = typed or (is_dataclass(node) and not isinstance(node, type))
        items = _items(node)
        if items is None or (prefix and not items):
            if prefix and typed:
                out.add(prefix)
            continue
        for key, value in items:
            stack.append((f"{prefix}.{key}" if prefix else str(key), value, typed))
    return out


def _is_omegaconf(data: Any) -> bool:
    return type(data).__name__ == "DictConfig" and type(data).__module__.startswith("omegaconf")


@checked(source=non_empty("a label for where the override comes from, e.g. 'the overrides'"))
def parse_override(text: str, dialect: Dialect, source: str = "the overrides") -> tuple[str, Any]:
    """One Hydra override (``[+|++]key.path=value``) as ``(path, value)``, the value typed by
    Hydra's grammar (``true``/``false`` any case, ``null``, integers, floats, else text) and
    then read by ``dialect``. ``~key`` (delete) gives ``(path, None)``."""
    body = text.lstrip("+")
    if body.startswith("~"):
        return body[1:].split("=", 1)[0], None
    path, eq, raw = body.partition("=")
    if not eq or not path:
        raise PrecisionConfigError(
            f"{dialect.program}: {text!r} in {source} is not a Hydra override (key.path=value); "
            f"write e.g. actor_rollout_ref.rollout.dtype=float16"
        )
    value: Any = raw
    low = raw.strip().lower()
    if low in ("true", "false"):
        value = low == "true"
    elif low in ("null", "~"):
        value = None
    else:
        for cast in (int, float):
            try:
                value = cast(raw)
                break
            except ValueError:
                continue
        if isinstance(value, str) and len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
            value = raw[1:-1]
    known = list(dialect.by_path)
    near = dialect.typo(path, known)
    if near is not None:
        raise dialect.error(
            path, source, f"is not a setting {dialect.program} has (did you mean {near!r}?)"
        )
    return path, dialect.value(path, value, source)
