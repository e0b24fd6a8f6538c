"""Reading the user's text files (config, sweep and cluster files): one place for the
errors every such file can have, each a :class:`~dana.errors.ConfigError` naming the file.

A file that cannot be read, that is not UTF-8 text (a binary file given by mistake),
that is not valid YAML or JSON (a syntax error, a ``!!python`` tag that plain YAML
refuses), whose top level is not a mapping, or whose keys are not names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from dana.errors import ConfigError


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
    level that is no mapping (``shape`` says what it must be) or a key that is no name."""
    kind = "JSON" if as_json else "YAML"
    try:
        values = json.loads(text) if as_json else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"{source}: not valid {kind}: {e}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"{source}: {shape}, got a {type(values).__name__}")
    bad = [k for k in values if not isinstance(k, str)]
    if bad:
        raise ConfigError(f"{source}: {bad[0]!r} is not an option name; {shape}")
    return values
