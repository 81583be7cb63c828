"""Reading YAML files and texts as configs: safely (plain data only), fast, strictly.

    data = read_yaml("configs/laptop.yaml")     # a mapping; bad input is one line naming the file and line

A key given twice in one mapping is refused (PyYAML keeps the last without a word); a number keeps the
text it was written as (``0755``, ``1.10``) for string settings; aliases that expand past
``MAX_CONFIG_VALUES`` are refused. libyaml's parser reads where PyYAML has it, the Python parser's
messages name bad input.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from orchestrator.core.errors import ConfigError


def read_yaml(path: str | Path) -> dict:
    """A YAML mapping from ``path``; a file that is missing, not UTF-8 or not YAML is a one-line error
    naming the file and the line."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory; expected a YAML config file")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigError(f"{path}:{line}: invalid UTF-8 byte 0x{raw[exc.start]:02x} at column {column} "
                          "(expected a UTF-8 YAML file)") from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}{_yaml_where(exc)}: invalid YAML: {_yaml_problem(exc)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    check_expanded_size(data, str(path))
    return data


#: The most values a config may hold once YAML's aliases (``*a``) are expanded: a few hundred bytes of nested
#: aliases ("billion laughs") expand to billions, and the config is copied whole
MAX_CONFIG_VALUES = 1_000_000


def check_expanded_size(data: Any, where: str) -> int:
    """The number of values ``data`` holds with its shared parts (YAML aliases) counted at every use;
    ConfigError when over ``MAX_CONFIG_VALUES`` or when a part holds itself (``&a [*a]``)."""
    sizes: dict[int, int] = {}
    open_parts: set[int] = set()

    def size(value: Any) -> int:
        if not isinstance(value, (dict, list)):
            return 1
        key = id(value)
        if key in sizes:
            return sizes[key]
        if key in open_parts:
            raise ConfigError(f"{where}: a YAML alias refers to the list or mapping that holds it")
        open_parts.add(key)
        parts = value.values() if isinstance(value, dict) else value
        total = 1 + sum(size(v) for v in parts)
        open_parts.discard(key)
        if total > MAX_CONFIG_VALUES:
            raise ConfigError(f"{where}: its YAML aliases expand to over {MAX_CONFIG_VALUES:,} values; "
                              "expected a config (write the values out, or use fewer nested aliases)")
        sizes[key] = total
        return total

    return size(data)


class _UniqueKeys:
    """Refuses a key given twice in one mapping: PyYAML keeps the last one without a word, so an experiment's
    second arm of one name replaced the first (the SimPT arm vanished, and the baseline became the other arm)
    and a search space's second ``seeds:`` replaced the first. Numbers keep the text they were written as."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.setdefault(key, key_node)
                except TypeError:  # an unhashable key: the base class says so
                    break
                if first is not key_node:
                    raise yaml.constructor.ConstructorError(
                        "while reading a mapping", node.start_mark,
                        f"the key {key!r} is given twice (first on line {first.start_mark.line + 1}): "
                        "keep one", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node):
        return _number_with_text(super().construct_yaml_int(node), node.value)

    def construct_yaml_float(self, node):
        return _number_with_text(super().construct_yaml_float(node), node.value)


class UniqueKeyLoader(_UniqueKeys, yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (``_UniqueKeys``)."""


#: The same loader on libyaml's parser (``yaml.CSafeLoader``) where PyYAML was built with it: about 10x faster
#: (a task's YAML is read for every trial's fingerprint and in every trial); None without libyaml
FastUniqueKeyLoader = (type("FastUniqueKeyLoader", (_UniqueKeys, yaml.CSafeLoader), {})
                       if getattr(yaml, "__with_libyaml__", False) else None)

for _loader in filter(None, (UniqueKeyLoader, FastUniqueKeyLoader)):
    _loader.add_constructor("tag:yaml.org,2002:int", _loader.construct_yaml_int)
    _loader.add_constructor("tag:yaml.org,2002:float", _loader.construct_yaml_float)


def key_line(path: str | Path, keys: list[str | int]) -> int | None:
    """The 1-based line of the key path ``keys`` (mapping keys and list indices) in the YAML file ``path``, for
    an error's place: the deepest of them the file holds (None when it holds none, or is not readable)."""
    try:
        node = yaml.compose(Path(path).read_text(encoding="utf-8-sig"), Loader=yaml.SafeLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    line = None
    for key in keys:
        if isinstance(key, int) and isinstance(node, yaml.SequenceNode) and key < len(node.value):
            node = node.value[key]
            line = node.start_mark.line + 1
            continue
        found = isinstance(node, yaml.MappingNode) and next(
            ((k, v) for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == key), None)
        if not found:
            break
        line, node = found[0].start_mark.line + 1, found[1]
    return line


def load_yaml(text: str) -> Any:
    """``text`` read as ``UniqueKeyLoader`` reads it, on libyaml's parser where PyYAML has it. Text that parser
    refuses is read again by the Python one, whose messages and positions the errors have always given
    (libyaml words them otherwise)."""
    if FastUniqueKeyLoader is not None:
        try:
            return yaml.load(text, Loader=FastUniqueKeyLoader)  # noqa: S506 (a SafeLoader: plain data only)
        except yaml.YAMLError:
            pass
    return yaml.load(text, Loader=UniqueKeyLoader)  # noqa: S506 (a SafeLoader: plain data only)


class _IntText(int):
    """An int YAML read from text that does not print back as it (``0755`` is 493): a string setting takes
    the text the user wrote (``yaml_text``); everything else sees the number."""
    yaml_text: str


class _FloatText(float):
    """As ``_IntText``, for a float (``1.10``, ``1e3``)."""
    yaml_text: str


def _number_with_text(value, text: str):
    if str(value) == text or not isinstance(value, (int, float)):
        return value
    number = (_IntText if isinstance(value, int) else _FloatText)(value)
    number.yaml_text = text
    return number


def _plain(value: Any) -> Any:
    """``value`` with every ``_IntText`` / ``_FloatText`` in it a plain int / float (a setting of any type
    keeps no trace of how its numbers were written)."""
    if isinstance(value, (_IntText, _FloatText)):
        return (int if isinstance(value, int) else float)(value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


# a document read with UniqueKeyLoader and written back (yaml.safe_dump) keeps its numbers
yaml.SafeDumper.add_representer(_IntText, yaml.SafeDumper.represent_int)
yaml.SafeDumper.add_representer(_FloatText, yaml.SafeDumper.represent_float)


def _yaml_where(exc: yaml.YAMLError) -> str:
    """':LINE:COLUMN' of a YAML error (1-based), or '' when PyYAML gives no position."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    return f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's message on one line: the problem and its context, without the quoted source lines."""
    parts = [getattr(exc, "context", None), getattr(exc, "problem", None)]
    text = "; ".join(p for p in parts if p) or str(exc).splitlines()[0]
    return " ".join(text.split())
