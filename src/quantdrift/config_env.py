"""The settings model tree, read as data: every name it accepts, and where a value came from.

One walk over a pydantic model (:func:`fields`) gives the rows of the generated
reference (``quantdrift config reference`` -> ``docs/settings.md``), the set of
valid ``QUANTDRIFT_*`` variable names (so a typo gets a warning naming the
closest one), and the rows of ``quantdrift config show``. The same walk serves
the gateway, policy and preflight YAML models, so the reference covers all four
places settings live.
"""

from __future__ import annotations

import difflib
import enum
import types
import typing
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, SecretStr, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from quantdrift.errors import ConfigError

PREFIX = "QUANTDRIFT_"
DELIMITER = "__"

# Variables read outside the Settings model, by the command that needs them.
EXTRA_ENV = {
    "QUANTDRIFT_GATEWAY__API_KEYS": (
        'JSON list of gateway API keys ({"name", "sha256", "routes", "high_precision"}), '
        "added to the gateway config's auth.keys (read by `quantdrift gateway`)"
    ),
    "QUANTDRIFT_VERDICT_API__TOKEN": (
        "bearer token the verdict API requires (read by `quantdrift verdict-api`; or --token-file)"
    ),
    "QUANTDRIFT_OTEL__EVALUATION_SAMPLE": (
        "fraction of scored pairs that become gen_ai.evaluation.result events "
        "(read by the worker when OpenTelemetry is on)"
    ),
    "QUANTDRIFT_LITELLM__CONFIG": (
        "path of the YAML file naming the routes the LiteLLM proxy callback guards "
        "(read inside the LiteLLM proxy)"
    ),
}
# Old names still honoured, with a warning naming the new one.
DEPRECATED_ENV = {"QUANTDRIFT_GATEWAY_API_KEYS": "QUANTDRIFT_GATEWAY__API_KEYS"}


@dataclass(frozen=True, slots=True)
class Field:
    """One leaf of a model tree: ``path`` parts, its type, default and constraints."""

    path: tuple[str, ...]
    type: str
    default: str
    constraints: str
    description: str
    secret: bool

    @property
    def dotted(self) -> str:
        return ".".join(self.path).replace(".[]", "[]")

    @property
    def env(self) -> str:
        return PREFIX + DELIMITER.join(self.path).upper()


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [a for a in typing.get_args(annotation) if _model_in(a) is not None]
        return _model_in(models[0]) if len(models) == 1 else None
    return None


def _container_model(annotation: Any) -> tuple[str, type[BaseModel]] | None:
    """``dict[str, Model]`` -> ("<name>", Model); ``list[Model]`` -> ("[]", Model)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is dict and len(args) == 2 and (m := _model_in(args[1])) is not None:
        return "<name>", m
    if origin in (list, tuple) and args and (m := _model_in(args[0])) is not None:
        return "[]", m
    return None


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " | ".join(repr(m.value) for m in annotation)
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return {"SecretStr": "secret", "NoneType": "None"}.get(
            annotation.__name__, annotation.__name__
        )
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            return f"tuple[{_type_name(args[0])}, ...]"
        return f"{name}[{', '.join(_type_name(a) for a in args)}]"
    return str(annotation).replace("typing.", "")


def _default(info: FieldInfo) -> str:
    if info.default is PydanticUndefined and info.default_factory is None:
        return "(required)"
    value = info.get_default(call_default_factory=True)
    return render(value)


def render(value: Any) -> str:
    """A value as a reader would type it; secrets never shown."""
    if isinstance(value, SecretStr):
        return "********"
    if isinstance(value, Mapping):
        inner = ", ".join(f"{k}: {render(v)}" for k, v in value.items())
        return "{" + inner + "}"
    if isinstance(value, tuple | list):
        return "[" + ", ".join(render(v) for v in value) + "]"
    if isinstance(value, BaseModel):
        return render(value.model_dump())
    if isinstance(value, enum.Enum):
        return str(value.value)
    if value is None:
        return "None"
    return str(value)


def _constraints(info: FieldInfo) -> str:
    out = []
    for m in info.metadata:
        for attr, sym in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            v = getattr(m, attr, None)
            if v is not None:
                out.append(f"{sym} {v}")
    return ", ".join(out)


def _secret(annotation: Any) -> bool:
    if annotation is SecretStr:
        return True
    return any(_secret(a) for a in typing.get_args(annotation))


def _comments(model: type[BaseModel]) -> dict[str, str]:
    """Field name -> the comment written beside or above it in the class body.

    The models document their fields in comments (read in code review); reading
    them here puts the same words in the reference instead of a second copy.
    """
    # Deferred: introspection only for the settings reference.
    import inspect
    import re

    try:
        lines = inspect.getsource(model).splitlines()
    except (OSError, TypeError):
        return {}
    out: dict[str, str] = {}
    above: list[str] = []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("# ").strip())
            continue
        m = re.match(r"\s+(\w+)\s*:", line)
        if m and not stripped.startswith(("def ", "return", '"')):
            inline = line.split("  # ", 1)[1].strip() if "  # " in line else ""
            text = " ".join([*above, inline]).strip()
            if text:
                out[m.group(1)] = text
        above = []
    return out


def fields(model: type[BaseModel], path: tuple[str, ...] = ()) -> Iterator[Field]:
    """Every leaf of ``model``, depth first, in declaration order."""
    notes = _comments(model)
    for name, info in model.model_fields.items():
        here = (*path, name)
        sub = _model_in(info.annotation)
        if sub is not None:
            yield from fields(sub, here)
            continue
        container = _container_model(info.annotation)
        if container is not None:
            part, inner = container
            yield from fields(inner, (*here, part))
            continue
        yield Field(
            path=here,
            type=_type_name(info.annotation),
            default=_default(info),
            constraints=_constraints(info),
            description=info.description or notes.get(name, ""),
            secret=_secret(info.annotation),
        )


def sections(model: type[BaseModel]) -> dict[str, str]:
    """Top-level sections of a settings model -> the first line of their docstring."""
    out = {}
    for name, info in model.model_fields.items():
        sub = _model_in(info.annotation)
        if sub is not None:
            out[name] = (sub.__doc__ or "").strip().splitlines()[0]
    return out


# -- environment names ---------------------------------------------------------


def env_names(model: type[BaseModel]) -> set[str]:
    """Every ``QUANTDRIFT_*`` name the model and the commands accept."""
    names = {f.env for f in fields(model)}
    # A whole section or a nested model may also be given as one JSON value.
    for f in fields(model):
        for i in range(1, len(f.path)):
            names.add(PREFIX + DELIMITER.join(f.path[:i]).upper())
    return names | set(EXTRA_ENV)


def unknown_env(environ: Mapping[str, str], model: type[BaseModel]) -> list[str]:
    """One warning per ``QUANTDRIFT_*`` variable nothing reads, naming the closest valid one."""
    valid = env_names(model)
    dict_fields = [f.env + DELIMITER for f in fields(model) if f.type.startswith("dict[")]
    warnings = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(PREFIX) or upper in valid:
            continue
        if upper in DEPRECATED_ENV or any(upper.startswith(p) for p in dict_fields):
            continue
        close = difflib.get_close_matches(upper, sorted(valid), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        warnings.append(f"unknown setting {name} is ignored{hint}")
    return warnings


# -- where a value came from ---------------------------------------------------


def lookup(data: Any, path: tuple[str, ...]) -> Any:
    for part in path:
        if isinstance(data, BaseModel):
            data = getattr(data, part)
        elif isinstance(data, Mapping):
            data = data.get(part)
        else:
            return None
    return data


def source_of(
    f: Field,
    environ: Mapping[str, str],
    file_data: Mapping[str, Any] | None,
    file_name: str | None,
    from_stack: set[tuple[str, ...]],
) -> str:
    """env, the config file, the stack state, or default: the first that set ``f``."""
    keys = {k.upper() for k in environ}
    for i in range(len(f.path), 0, -1):
        if PREFIX + DELIMITER.join(f.path[:i]).upper() in keys:
            return "env " + PREFIX + DELIMITER.join(f.path[:i]).upper()
    if f.path in from_stack:
        return "stack state"
    if file_data is not None and _present(file_data, f.path):
        return f"file {file_name}"
    return "default"


def _present(data: Mapping[str, Any], path: tuple[str, ...]) -> bool:
    cur: Any = data
    for part in path:
        if not isinstance(cur, Mapping) or part not in cur:
            return False
        cur = cur[part]
    return True


def masked(f: Field, value: Any) -> str:
    """The value for display: secrets as ********, passwords out of URLs."""
    if f.secret and value is not None:
        if isinstance(value, Mapping):
            return "{" + ", ".join(f"{k}: ********" for k in value) + "}"
        return "********"
    text = render(value)
    if "://" in text and "@" in text:
        return redact(text)
    return text


def redact(url: str) -> str:
    """``url`` without its password, for messages, logs and the settings shown.

    >>> redact("redis://:hunter2@cache:6379/0")
    'redis://:***@cache:6379/0'
    >>> redact("redis://cache:6379")
    'redis://cache:6379'
    """
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def reference_markdown(models: list[tuple[str, str, type[BaseModel], bool]]) -> str:
    """docs/settings.md: one table per model (title, intro, model, env names or not)."""
    out = [
        "# Settings reference",
        "",
        "<!-- Generated by `quantdrift config reference > docs/settings.md`; do not edit. -->",
        "",
        "Settings live in four places. Every name below comes from the code's models, so",
        "this page cannot fall behind them (a test compares it with the generated one).",
        "",
        "* **Environment** (`QUANTDRIFT_SECTION__FIELD`, nested with `__`), or the same",
        "  tree in a YAML file given to `quantdrift worker --config FILE` (the environment",
        "  wins over the file). Dict and list values are JSON. `quantdrift config show`",
        "  prints the effective values and where each came from; an unknown",
        "  `QUANTDRIFT_` variable gets a warning naming the closest valid one.",
        "* **Gateway YAML** (`quantdrift gateway --config FILE`).",
        "* **Policy YAML** (`QUANTDRIFT_POLICY_FILE`, or `replay --policy`).",
        "* **Preflight YAML** (`quantdrift preflight --config FILE`).",
        "",
        "`quantdrift config validate FILE` checks any of the three YAML files and",
        "prints every error, one per line.",
        "",
    ]
    for title, intro, model, env in models:
        out += [f"## {title}", "", intro, ""]
        if env:
            out += ["| Variable | Type | Default | Notes |", "|---|---|---|---|"]
        else:
            out += ["| Key | Type | Default | Notes |", "|---|---|---|---|"]
        for f in fields(model):
            name = f.env if env else f.dotted
            notes = "; ".join(x for x in (f.constraints, f.description) if x)
            cells = [f"`{name}`", _cell(f.type), _cell(f.default), _cell(notes)]
            out.append("| " + " | ".join(cells) + " |")
        if env:
            for name, text in EXTRA_ENV.items():
                out.append(f"| `{name}` | JSON | (none) | {_cell(text)} |")
            for old, new in DEPRECATED_ENV.items():
                out.append(f"| `{old}` | | | deprecated name of `{new}` |")
        out.append("")
    return "\n".join(out)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ") if text else ""


def read_yaml(path: Path, what: str = "") -> Any:
    """A YAML file's data ({} when empty); ConfigError (one line, ``[WHAT ]PATH: why``)
    when it cannot be read or parsed."""
    # Deferred: yaml only when a config file is validated.
    import yaml

    where = f"{what} {path}" if what else str(path)
    try:
        return yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"{where}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: invalid YAML: {' '.join(str(exc).split())}") from exc


def read_yaml_mapping(path: Path, what: str) -> dict[str, Any]:
    """A config file's top level, which must be a mapping (``what`` names the file in
    every message, e.g. ``preflight config``): the one way the YAML configs are read."""
    data = read_yaml(path, what)
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path}: expected a mapping at the top")
    return data


def first_problem(exc: ValidationError, what: str) -> str:
    """The first thing pydantic refused, as one line: ``WHAT: field.path: why``.

    >>> from pydantic import BaseModel
    >>> class Section(BaseModel):
    ...     port: int
    >>> try:
    ...     Section.model_validate({"port": "x"})
    ... except ValidationError as exc:
    ...     print(first_problem(exc, "demo config"))
    demo config: port: Input should be a valid integer, unable to parse string as an integer
    """
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "<root>"
    return f"{what}: {loc}: {first['msg']}"


def unknown_keys(data: Any, model: type[BaseModel], path: tuple[str, ...] = ()) -> list[str]:
    """``path: unknown key (did you mean ...?)`` for every key of ``data`` the model lacks.

    Models that ignore extra keys (Settings must, for the environment's sake) would
    otherwise take a misspelt key in a file silently.
    """
    if not isinstance(data, Mapping):
        return []
    out = []
    for key, value in data.items():
        here = (*path, str(key))
        info = model.model_fields.get(str(key))
        if info is None:
            close = difflib.get_close_matches(str(key), list(model.model_fields), n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            out.append(f"{'.'.join(here)}: unknown key{hint}")
            continue
        sub = _model_in(info.annotation)
        if sub is not None:
            out += unknown_keys(value, sub, here)
    return out


def error_lines(exc: Any) -> list[str]:
    """A pydantic ValidationError as one ``loc: message`` line per error."""
    lines = []
    for e in exc.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "<top>"
        lines.append(f"{loc}: {e['msg']}")
    return lines
