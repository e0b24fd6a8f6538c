"""Reading the user's text files (config, sweep and cluster files): one place for the
errors every such file can have, each a :class:`~dana.errors.ConfigError` naming the file.

A file that cannot be read, that is not UTF-8 text (a binary file given by mistake),
that is not valid YAML or JSON (a syntax error, a ``!!python`` tag that plain YAML
refuses), nested deeper than :data:`MAX_DEPTH` (or looping on itself through a YAML
alias), whose top level is not a mapping, or whose keys are not names.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import yaml

from dana.errors import ConfigError

#: The deepest nesting of lists and mappings a file (or an option's value) may hold: a
#: few levels serve every option; a deeper one would exhaust Python's recursion limit
#: in the parser or in what reads the value later.
MAX_DEPTH = 100


def read_text(path: str | Path, what: str) -> str:
    """The text of ``path``; ConfigError naming ``what`` (``the config file``) when it
    cannot be read or is not UTF-8 text."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read {what}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"{path}: {what} is not a text file (byte {e.start} is not UTF-8); give a YAML "
            "or JSON file"
        ) from None


def parse_mapping(text: str, source: str, shape: str, as_json: bool = False) -> dict[str, Any]:
    """The mapping that ``text`` (YAML, or JSON when ``as_json``) holds, ``{}`` for an
    empty one; ConfigError naming ``source`` for a syntax error, a refused tag, a top
    level that is no mapping (``shape`` says what it must be), a key that is no name, or
    nesting deeper than :data:`MAX_DEPTH`."""
    kind = "JSON" if as_json else "YAML"
    try:
        values = json.loads(text) if as_json else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"{source}: not valid {kind}: {e}") from None
    except RecursionError:
        raise ConfigError(f"{source}: {NESTED}") from None
    if too_deep(values):
        raise ConfigError(f"{source}: {NESTED}")
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"{source}: {shape}, got a {type(values).__name__}")
    bad = [k for k in values if not isinstance(k, str)]
    if bad:
        raise ConfigError(f"{source}: {bad[0]!r} is not an option name; {shape}")
    return values


NESTED = (
    f"lists and mappings nested more than {MAX_DEPTH} levels deep (or a YAML alias inside "
    "itself); an option's value needs a few levels: flatten it"
)


def too_deep(value: Any) -> bool:
    """Whether ``value`` nests lists and mappings more than :data:`MAX_DEPTH` deep (a
    container inside itself does), found without recursion."""
    deepest: dict[int, int] = {}  # id -> the deepest level a container was seen at
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, dict | list) or deepest.get(id(item), 0) >= depth:
            continue
        if depth > MAX_DEPTH:
            return True
        deepest[id(item)] = depth
        stack.extend(
            (child, depth + 1) for child in (item.values() if isinstance(item, dict) else item)
        )
    return False


def is_number(value: Any) -> bool:
    """Whether ``value`` is a finite int or float, not a boolean; an integer too large
    for a float (a YAML or JSON integer of 400 digits) is not one."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False
