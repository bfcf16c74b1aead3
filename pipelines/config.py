"""Typed configuration: YAML files and ``key=value`` overrides into frozen, validated dataclasses.

Every stage's config is a dataclass whose fields carry a help text (``metadata={"help": ...}``) and whose
``__post_init__`` validates values. This module turns plain data into such dataclasses, checking each
key against the fields (an unknown key is an error that lists the known ones) and each value against the
field's type annotation (``int``, ``float``, ``str``, ``bool``, ``X | None``, ``tuple[X, ...]``,
``list[X]``, ``dict[str, X]``, ``Literal``, nested dataclasses). Errors name the full dotted key.

A config class may declare ``renamed_keys`` (a ClassVar mapping an old key to its dotted key now, e.g.
agpo.trainer_config's ``learning_rate`` -> ``optimizer.learning_rate``): a config that still sets an old key has
it moved to its new place with a deprecation warning naming both (``move_renamed_keys``), and one that sets both
is a config error.

A config's secrets never reach a log, an MLflow param or a step marker (``public_params``): a key is secret when
one of its words (split at anything but letters and digits, lower-cased) contains a stem of ``SECRET_STEMS`` (or
is a word of ``SECRET_WORDS``), unless it is a token count or a tokenizer (``NOT_SECRET_*``); such keys are left
out (or masked) and URLs in strings lose their user info and secret query values (``redact_urls``:
``postgresql://***@db:5432/runs?password=***``); ``flatten`` makes MLflow params of what is left. The one rule
for MLflow params, step markers, ``--print-config``, config errors and URIs in messages.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import types
import typing
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from pipelines.io import require_file

C = TypeVar("C")
COMMENT = re.compile(r"(^|\s)#")  # where YAML starts a comment
QUOTED = ('"', "'", "[", "{")  # a value written as YAML quotes or brackets its own # signs

LOG = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A configuration key or value is wrong; the message names it."""


def load_config(
    cls: type[C], paths: str | Path | typing.Sequence[str | Path] = (), overrides: typing.Sequence[str] = ()
) -> C:
    """Build ``cls`` from YAML files (merged in order, later keys win) and ``key.sub=value`` overrides.

    A file given as ``section.sub=FILE.yaml`` is mounted under that dotted key, so a preset written for
    one stage (``configs/cpu-tiny.yaml``) also configures a stage that nests it (``train=...``).
    """
    data: dict[str, Any] = {}
    for entry in [paths] if isinstance(paths, str | Path) else paths:
        section, sep, path = str(entry).rpartition("=") if "=" in str(entry) else ("", "", str(entry))
        loaded = _read_yaml(Path(path))
        for key in reversed(section.split(".") if sep else []):
            loaded = {key: loaded}
        _merge(data, loaded)
    for override in overrides:
        _apply_override(data, override)
    return from_dict(cls, data)


def apply_presets(config: C, paths: typing.Sequence[str | Path] = (), overrides: typing.Sequence[str] = ()) -> C:
    """``config`` with YAML files merged over it (in order) and ``key.sub=value`` overrides applied."""
    cls = type(config)
    data = to_dict(config)
    for path in paths:
        _merge(data, move_renamed_keys(cls, _read_yaml(Path(path))))
    for override in overrides:  # each moved on its own: ``data`` already holds every key at its new place
        update: dict[str, Any] = {}
        _apply_override(update, override)
        _merge(data, move_renamed_keys(cls, update))
    return from_dict(cls, data)


def _read_yaml(path: Path) -> dict[str, Any]:
    require_file(path, "config file", "fix the --config path", ConfigError)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err.strerror}") from None
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {err}") from None
    if loaded is not None and not isinstance(loaded, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top, got {type(loaded).__name__}")
    return loaded or {}


def _merge(base: dict[str, Any], update: dict[str, Any]) -> None:
    """Deep-merge ``update`` into ``base``: nested mappings merge, anything else replaces."""
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


def _apply_override(data: dict[str, Any], override: str) -> None:
    key, sep, raw = override.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {override!r} must look like key=value (dotted keys reach nested fields)")
    *parents, leaf = key.strip().split(".")
    node = data
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {override!r}: {part!r} is not a section")
        node = child
    if COMMENT.search(raw) and not raw.lstrip().startswith(QUOTED):
        node[leaf] = raw  # YAML would cut " #..." off as a comment; on a command line it is part of the value
        return
    try:
        node[leaf] = yaml.safe_load(raw)
    except yaml.YAMLError as err:  # a tag (!!python/object:..., !foo) or broken syntax: the value, not a bug
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        tags = "only YAML's standard tags (!!str, !!int, ...) are read; " if "tag" in problem else ""
        raise ConfigError(
            f"override {key.strip()!r}: value {_shown(key.strip(), raw)} is not valid YAML ({problem}); {tags}"
            "quote the value to set it as a string"
        ) from None


def literal_override(key: str, value: Any) -> str:
    """``key=value`` that the override parser reads back as exactly ``value`` (a path with spaces, ``#``,
    quotes or YAML syntax stays itself): the value is written as JSON, which YAML reads as written."""
    return f"{key}={json.dumps(value)}"


def move_renamed_keys(cls: type, data: Any, prefix: str = "", warn: bool = True) -> Any:
    """``data`` (as written, before any default is filled in) with every old key of ``cls`` and of its nested
    config classes (their ``renamed_keys``) moved to its new dotted key, one deprecation warning per key moved
    (``warn``; off for settings a run recorded, pipelines.rl.stage.run_once).

    Raises ``ConfigError`` naming both keys when the old and the new one are both set. ``data`` is not changed.
    """
    if not (dataclasses.is_dataclass(cls) and isinstance(data, dict)):
        return data
    moved = dict(data)
    for old, new in getattr(cls, "renamed_keys", {}).items():
        if old not in moved:
            continue
        value = moved.pop(old)
        *parents, leaf = new.split(".")
        node = moved
        for part in parents:
            child = node.get(part)
            if child is not None and not isinstance(child, dict):
                raise ConfigError(f"{prefix}{part} must be a mapping (it holds {prefix}{new}), got {child!r}")
            node[part] = node = dict(child or {})
        if leaf in node:
            raise ConfigError(
                f"config keys {prefix}{old} and {prefix}{new} are both set: {prefix}{old} is the old name of "
                f"{prefix}{new}; set only {prefix}{new}"
            )
        node[leaf] = value
        if warn:
            LOG.warning(
                "config key %s%s is deprecated and will be removed in the next release: use %s%s",
                prefix,
                old,
                prefix,
                new,
            )
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in moved and dataclasses.is_dataclass(hints[f.name]):
            moved[f.name] = move_renamed_keys(hints[f.name], moved[f.name], f"{prefix}{f.name}.", warn)
    return moved


def from_dict(cls: type[C], data: dict[str, Any], prefix: str = "") -> C:
    """Build dataclass ``cls`` from a mapping, checking keys and value types (old keys moved first:
    ``move_renamed_keys``)."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'} must be a mapping, got {data!r}")
    data = move_renamed_keys(cls, data, prefix)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(prefix + str(key) for key in data if key not in fields)  # YAML keys can be 1 or null
    if unknown:
        raise ConfigError(f"unknown config key(s) {unknown}; known keys here: {', '.join(sorted(fields))}")
    hints = typing.get_type_hints(cls)
    data = {name: _over_field_default(fields[name], hints[name], value) for name, value in data.items()}
    values = {name: _convert(hints[name], value, prefix + name) for name, value in data.items()}
    try:
        return cls(**values)
    except ConfigError:
        raise
    except (TypeError, ValueError) as err:
        where = f" in {prefix.rstrip('.')}" if prefix else ""
        raise ConfigError(f"invalid config{where}: {err}") from None


def _over_field_default(field: dataclasses.Field, annotation: Any, value: Any) -> Any:
    """A partial mapping for a nested dataclass field is applied over that field's own default (e.g.
    ``TinyModelConfig(vocab_size=400)``), not over the nested class's defaults."""
    if not (dataclasses.is_dataclass(annotation) and isinstance(value, dict)):
        return value
    if field.default_factory is not dataclasses.MISSING:
        default = field.default_factory()
    elif field.default is not dataclasses.MISSING:
        default = field.default
    else:
        return value
    merged = to_dict(default)
    _merge(merged, value)
    return merged


def _shown(key: str, value: Any) -> str:
    """A value as an error shows it: ``***`` under a secret-named key, else its repr with the user info and secret
    parameters of any URL in it redacted (pipelines.tracking's rules, as MLflow params and --print-config)."""
    return REDACTED if is_secret_key(key) else redact_urls(repr(value))


def _convert(annotation: Any, value: Any, key: str) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if dataclasses.is_dataclass(annotation):
        return from_dict(annotation, value if value is not None else {}, key + ".")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _convert(arg, value, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: {_shown(key, value)} matches none of {args}")
    if origin is typing.Literal:
        if value not in args:
            raise ConfigError(f"{key} must be one of {list(args)}, got {_shown(key, value)}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{key} must be a list, got {_shown(key, value)}")
        item_type = args[0] if args else Any
        items = [_convert(item_type, v, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping, got {_shown(key, value)}")
        value_type = args[1] if args else Any
        return {str(k): _convert(value_type, v, f"{key}.{k}") for k, v in value.items()}
    return _convert_scalar(annotation, value, key)


def _convert_scalar(annotation: Any, value: Any, key: str) -> Any:
    if annotation is Any or annotation is object:
        return value
    if annotation is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key} must be true or false, got {_shown(key, value)}")
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key} must be an integer, got {_shown(key, value)}")
        return value
    if annotation is float:
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{key} must be a number, got {_shown(key, value)}")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, got {_shown(key, value)}")
        return value
    raise ConfigError(f"{key}: unsupported config type {annotation!r}")


def to_dict(config: Any) -> dict[str, Any]:
    """Plain nested dict of a config dataclass (tuples become lists), e.g. for YAML dumps."""

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    return plain(config)


def describe(cls: type, prefix: str = "", owned: Collection[str] | None = None) -> list[str]:
    """One line per field, ``key (default): help``, nested dataclasses flattened with dotted keys under a header
    line, ``[section] help``. A config class's ``owned_keys`` (keys its stage sets itself, e.g. the pipeline's
    run folders) are not listed as keys: one closing line names them."""
    top = owned is None
    owned = getattr(cls, "owned_keys", {}) if top else owned
    lines = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if prefix + f.name in owned:
            continue
        if dataclasses.is_dataclass(hints[f.name]):
            lines.append(f"  [{prefix}{f.name}] {f.metadata.get('help', '')}".rstrip())
            lines.extend(describe(hints[f.name], prefix + f.name + ".", owned))
            continue
        if f.default is not dataclasses.MISSING:
            default = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = repr(f.default_factory())
        else:
            default = "required"
        lines.append(f"  {prefix}{f.name} ({default}): {f.metadata.get('help', '')}")
    if top and owned:
        lines.append(f"  (set by the stage itself, an error to set: {', '.join(owned)})")
    return lines


# A key is a secret when one of its words (split at anything but letters and digits, lower-cased) contains
# one of these stems: api_token, hf_token, auth_header, db_dsn, aws_secret_access_key, apikey, mlflowpassword.
SECRET_STEMS = ("secret", "token", "password", "passwd", "key", "auth", "dsn", "credential", "signature")
SECRET_WORDS = frozenset({"sig"})  # a whole word only (an Azure SAS URL's sig=...): "signal" is no secret
# ...except these words and keys, which name token counts and tokenizers, never secrets. A new config key
# with a stem is left out of MLflow until it is listed here (tests/pipelines/test_tracking.py checks that
# every stage's config key is kept).
NOT_SECRET_WORDS = frozenset({"tokenizer", "tokenizers"})
NOT_SECRET_KEYS = frozenset(
    {"max_new_tokens", "max_tokens", "max_num_batched_tokens", "generated_tokens", "token_budget", "token_weights"}
)
# user info in a URL (scheme://user:password@host, scheme://user@host): up to the last '@' before a space
URL_USER_INFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)[^\s'\"<>]*@")
# a query parameter (?password=..., &sslkey=...): its value is redacted when its name is a secret key's
URL_QUERY_PARAM = re.compile(r"(?P<lead>[?&;](?P<name>[A-Za-z0-9_.\-]+)=)(?P<value>[^&;#\s'\"<>]+)")
REDACTED = "***"
MAX_PARAM_CHARS = 500  # an MLflow param value's length here (flatten)


def is_secret_key(key: str) -> bool:
    """Whether a config key (dotted or not) looks like it holds a secret (``SECRET_STEMS``, ``NOT_SECRET_*``)."""
    parts = [part for part in key.lower().split(".") if part not in NOT_SECRET_KEYS]
    words = [w for part in parts for w in re.split(r"[^a-z0-9]+", part) if w not in NOT_SECRET_WORDS]
    return any(word in SECRET_WORDS or any(stem in word for stem in SECRET_STEMS) for word in words)


def redact_urls(text: str) -> str:
    """``text`` with the user info of every URL and the values of its secret query parameters replaced:
    ``postgresql://***@db:5432/runs?password=***&sslmode=require``."""
    text = URL_USER_INFO.sub(rf"\g<scheme>{REDACTED}@", text)

    def query_param(match: re.Match) -> str:
        return match["lead"] + REDACTED if is_secret_key(match["name"]) else match[0]

    return URL_QUERY_PARAM.sub(query_param, text)


def public_params(config: Any, masked: bool = False) -> Any:
    """A nested config (mappings, lists, scalars) without secrets: keys that look like secrets are left out
    (with what they hold), or with ``masked`` kept with ``***`` for a value that is set, and URLs in strings
    are redacted (``redact_urls``). What MLflow params and step markers hold; masked, what
    ``agpo STAGE --print-config`` prints."""
    if isinstance(config, Mapping):
        public = {}
        for key, value in config.items():
            if not is_secret_key(str(key)):
                public[key] = public_params(value, masked)
            elif masked:
                public[key] = None if value is None else REDACTED
        return public
    if isinstance(config, list | tuple):
        return [public_params(value, masked) for value in config]
    if isinstance(config, str):
        return redact_urls(config)
    return config


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Dotted keys -> short string values of ``public_params(config)`` (MLflow params)."""
    flat = {}
    for key, value in public_params(config).items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = redact_urls(str(value))[:MAX_PARAM_CHARS]
    return flat
