"""Named sweep specifications shipped with the package (``dana/presets/*.yaml``).

A preset is a YAML mapping: ``description:``, ``grid:`` (option -> list of values),
``baseline:`` (the algorithm run at one worker) and any ``dana train`` option as a fixed
setting; see :class:`~dana.experiments.grid.SweepSpec`. ``dana sweep --config FILE``
reads a file of the same form.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from dana.errors import ConfigError
from dana.experiments.grid import SweepSpec
from dana.textfile import parse_mapping, read_text


def preset_names() -> list[str]:
    """The names of the shipped presets, sorted."""
    folder = resources.files("dana") / "presets"
    if not folder.is_dir():
        return []
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_preset(name: str) -> SweepSpec:
    """The preset ``name``; ConfigError lists the valid names if there is none such."""
    if name not in preset_names():
        raise ConfigError(
            f"--preset {name!r} is unknown; choose one of: {', '.join(preset_names()) or '(none)'}"
        )
    text = (resources.files("dana") / "presets" / f"{name}.yaml").read_text()
    return SweepSpec.from_dict(_mapping(text, f"preset {name}"), f"preset {name}")


def load_spec_file(path: str | Path) -> SweepSpec:
    """A sweep spec from a YAML (or JSON) file; ConfigError if unreadable or invalid."""
    path = Path(path)
    text = read_text(path, "the sweep config")
    return SweepSpec.from_dict(_mapping(text, str(path)), str(path))


def _mapping(text: str, source: str) -> dict[str, Any]:
    return parse_mapping(text, source, "a sweep config must hold a mapping of option: value")
