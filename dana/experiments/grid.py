"""A sweep's specification and its expansion into cells (one training run each).

A :class:`SweepSpec` holds the options shared by every run (``fixed``), the options
that vary (``grid``: option -> list of values) and the algorithm of the one-worker
baseline. :func:`expand` turns it into :class:`Cell` objects, each a complete set of
``dana train`` options and a directory name made from the settings that vary.

Runs with ``workers == 1`` are the single-worker baseline: with one worker every
algorithm collapses to plain (momentum or Nesterov) SGD, so only ``baseline``
(default ``dana-slim``: exactly ``torch.optim.SGD(momentum=m, nesterov=True)`` with
one worker) is run there, once per seed; ``baseline="all"`` runs every algorithm.

>>> spec = SweepSpec(grid={"algorithm": ["ssgd", "dana-slim"], "workers": [1, 4], "seed": [0]})
>>> [c.name for c in expand(spec)]
['dana-slim_k1_s0', 'ssgd_k4_s0', 'dana-slim_k4_s0']

``also`` adds cells that are not a product: each entry is a grid laid over the main one
(its axes replace the main grid's), and its cells join the main grid's in run order.
At one worker the main grid runs the baseline; an ``also`` grid runs its own baseline
only when it names ``workers`` itself (a grid that changes the schedule, say, needs a
baseline on that schedule; one that adds an algorithm's variant does not).

>>> spec.also = [{"algorithm": ["ssgd"], "lr_scaling": ["linear"]}]
>>> [c.name for c in expand(spec)]
['dana-slim_k1_s0', 'ssgd_k4_s0', 'dana-slim_k4_s0', 'ssgd_k4_s0_lr-scalinglinear']
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dana.errors import ConfigError
from dana.train.config import TrainConfig

#: The axes every sweep has, in the order cells are run: all of seed 0 first, so that a
#: partial sweep holds complete tables for its first seeds.
MAIN_AXES = ("seed", "workers", "algorithm")
#: Plural spellings accepted in a ``grid:`` section or on the command line.
ALIASES = {"algorithms": "algorithm", "seeds": "seed", "worker": "workers"}
DEFAULT_BASELINE = "dana-slim"


def option_names() -> set[str]:
    """The names of every ``dana train`` option (the fields of TrainConfig)."""
    return {f.name for f in dataclasses.fields(TrainConfig)}


def canonical_key(key: str) -> str:
    """``lr-decay-epochs`` -> ``lr_decay_epochs``; plural aliases -> the option name."""
    key = key.replace("-", "_")
    return ALIASES.get(key, key)


@dataclass
class SweepSpec:
    """What a sweep runs: fixed options, a grid of varied options, the baseline algorithm."""

    fixed: dict[str, Any] = field(default_factory=dict)
    grid: dict[str, list[Any]] = field(default_factory=dict)
    baseline: str = DEFAULT_BASELINE
    description: str = ""
    #: Further grids laid over ``grid`` (their axes replace its), for cells that are
    #: not a product (one algorithm with one more setting, say).
    also: list[dict[str, list[Any]]] = field(default_factory=list)
    #: ``{"above_spread": pp, "seeds": [...]}``: run these seeds too for a cell whose
    #: grid seeds' final errors differ by more than ``pp`` percentage points (or where
    #: one diverged and another did not); see :func:`dana.experiments.sweep.more_seeds`.
    more_seeds: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "sweep spec") -> SweepSpec:
        """A spec from a mapping: ``grid:``, ``baseline:``, ``description:``, and any
        ``dana train`` option as a fixed setting (a preset or ``--config`` file)."""
        values = dict(values)
        grid_values = values.pop("grid", None) or {}
        if not isinstance(grid_values, dict):
            raise ConfigError(f"{source}: 'grid' must map option names to lists of values")
        baseline = values.pop("baseline", DEFAULT_BASELINE)
        description = values.pop("description", "")
        also_values = values.pop("also", None) or []
        more_seeds = values.pop("more_seeds", None) or {}
        if not isinstance(also_values, list) or not all(isinstance(g, dict) for g in also_values):
            raise ConfigError(f"{source}: 'also' must be a list of grids (option: [values])")
        values.pop("dana_version", None)
        fixed = {canonical_key(k): v for k, v in values.items()}
        grid = _grid(grid_values)
        also = [_grid(g) for g in also_values]
        spec = cls(fixed, grid, str(baseline), str(description), also, dict(more_seeds))
        spec.check(source)
        return spec

    def to_dict(self) -> dict[str, Any]:
        return {
            "description": self.description,
            "baseline": self.baseline,
            "grid": {k: list(v) for k, v in self.grid.items()},
            **(
                {"also": [{k: list(v) for k, v in g.items()} for g in self.also]}
                if self.also
                else {}
            ),
            **({"more_seeds": dict(self.more_seeds)} if self.more_seeds else {}),
            **self.fixed,
        }

    def check(self, source: str = "sweep spec") -> None:
        """Raise ConfigError for unknown option names or empty value lists."""
        names = option_names()
        grids = [("grid option", self.grid)] + [("'also' grid option", g) for g in self.also]
        for where, keys in (("option", self.fixed), *grids):
            unknown = sorted(set(keys) - names)
            if unknown:
                raise ConfigError(
                    f"{source}: unknown {where}(s) {', '.join(unknown)}; valid: "
                    f"{', '.join(sorted(names))}"
                )
        if self.more_seeds:
            spread, seeds = self.more_seeds.get("above_spread"), self.more_seeds.get("seeds")
            if (
                set(self.more_seeds) != {"above_spread", "seeds"}
                or isinstance(spread, bool)
                or not isinstance(spread, int | float)
                or not spread >= 0
                or not isinstance(seeds, list)
                or not seeds
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in seeds)
            ):
                raise ConfigError(
                    f"{source}: more_seeds must be {{above_spread: PP, seeds: [N, ...]}} "
                    f"(a spread in percentage points >= 0, integer seeds), got {self.more_seeds!r}"
                )
        for grid in (self.grid, *self.also):
            for key, vals in grid.items():
                if not vals:
                    raise ConfigError(f"{source}: grid option {key!r} has no values")
                if len(set(map(repr, vals))) != len(vals):
                    raise ConfigError(f"{source}: grid option {key!r} repeats a value: {vals!r}")

    def override(self, fixed: dict[str, Any], grid: dict[str, list[Any]]) -> SweepSpec:
        """A copy with ``fixed`` options and ``grid`` axes laid over this spec.

        A fixed option replaces a grid axis of the same name (a value given on the
        command line wins over a list in the preset), and a grid axis replaces a fixed
        option of the same name.
        """
        new_fixed = {k: v for k, v in self.fixed.items() if k not in grid}
        new_fixed.update(fixed)
        new_grid = {k: v for k, v in self.grid.items() if k not in fixed}
        new_grid.update(grid)
        return dataclasses.replace(self, fixed=new_fixed, grid=new_grid)


@dataclass(frozen=True)
class Cell:
    """One run of a sweep: its directory name and its complete ``dana train`` options."""

    name: str
    options: dict[str, Any]

    @property
    def algorithm(self) -> str:
        return self.options["algorithm"]

    @property
    def workers(self) -> int:
        return self.options["workers"]

    @property
    def seed(self) -> int:
        return self.options["seed"]

    def config(self) -> TrainConfig:
        """The validated TrainConfig of this cell (ConfigError names the cell)."""
        return TrainConfig.from_dict(self.options, f"sweep cell {self.name}").validate()


def axes(spec: SweepSpec) -> dict[str, list[Any]]:
    """Every axis of the grid: seed, workers, algorithm (from the grid, the fixed options
    or TrainConfig's defaults), then the other grid options in their given order."""
    default = TrainConfig()
    result: dict[str, list[Any]] = {}
    for key in MAIN_AXES:
        if key in spec.grid:
            result[key] = list(spec.grid[key])
        else:
            result[key] = [spec.fixed.get(key, getattr(default, key))]
    for key, vals in spec.grid.items():
        if key not in MAIN_AXES:
            result[key] = list(vals)
    return result


def expand(spec: SweepSpec) -> list[Cell]:
    """The cells of ``spec`` in run order (seed, then workers, then algorithm, then the
    other axes); at ``workers == 1`` only the baseline algorithm (see the module doc).
    The cells of the ``also`` grids join in the same order of seeds and worker counts.

    Raises ConfigError when two cells would share a directory name.
    """
    spec.check()
    cells: list[Cell] = []
    seen: dict[str, Cell] = {}
    for n, grid in enumerate((spec.grid, *spec.also)):
        own_baseline = n == 0 or "workers" in grid
        _expand_one(spec, {**spec.grid, **grid}, cells, seen, own_baseline)
    if not spec.also:
        return cells
    order = {key: [] for key in ("seed", "workers")}
    for cell in cells:
        for key, values in order.items():
            if cell.options[key] not in values:
                values.append(cell.options[key])
    return sorted(
        cells, key=lambda c: (order["seed"].index(c.seed), order["workers"].index(c.workers))
    )


def _expand_one(
    spec: SweepSpec,
    grid_axes: dict[str, list[Any]],
    cells: list[Cell],
    seen: dict[str, Cell],
    own_baseline: bool,
) -> None:
    grid = axes(dataclasses.replace(spec, grid=grid_axes))
    extra = [k for k in grid if k not in MAIN_AXES]
    for values in itertools.product(*grid.values()):
        setting = dict(zip(grid, values))
        if setting["workers"] == 1 and spec.baseline != "all":
            if not own_baseline:  # the main grid runs the one-worker baseline
                continue
            setting["algorithm"] = spec.baseline
        options = {**spec.fixed, **setting}
        name = cell_name(options, extra)
        if name in seen:
            if seen[name].options == options:
                continue  # the baseline, reached once per algorithm
            raise ConfigError(
                f"two sweep cells would both be named {name!r}; give the grid values that "
                "differ distinct names"
            )
        cell = Cell(name, options)
        seen[name] = cell
        cells.append(cell)


def _grid(values: dict[str, Any]) -> dict[str, list[Any]]:
    return {canonical_key(k): v if isinstance(v, list) else [v] for k, v in values.items()}


def cell_name(options: dict[str, Any], extra: list[str] | tuple[str, ...] = ()) -> str:
    """``{algorithm}_k{workers}_s{seed}`` then ``_{option}{value}`` for each extra axis;
    a cluster by its name alone, a data split shortly (``iid``, ``dir0.5``, ``shards2``).

    >>> cell_name({"algorithm": "dana-slim", "workers": 16, "seed": 0, "lr": 0.05}, ["lr"])
    'dana-slim_k16_s0_lr0.05'
    >>> cell_name({"algorithm": "asgd", "workers": 8, "seed": 1, "cluster": "geo",
    ...            "partition": "dirichlet:0.5"}, ["cluster", "partition"])
    'asgd_k8_s1_geo_dir0.5'
    """
    parts = [str(options["algorithm"]), f"k{options['workers']}", f"s{options['seed']}"]
    parts += [_axis_text(key, options[key]) for key in extra]
    return re.sub(r"[^A-Za-z0-9._+-]", "-", "_".join(parts))


def _axis_text(key: str, value: Any) -> str:
    if key == "cluster":
        if isinstance(value, dict):
            return str(value.get("name", "cluster"))
        return "nocluster" if value is None else Path(str(value)).stem
    if key == "partition" and isinstance(value, str):
        kind, _, rest = value.partition(":")
        return {"dirichlet": "dir"}.get(kind, kind) + rest
    return f"{key.replace('_', '-')}{_value_text(value)}"


def _value_text(value: Any) -> str:
    if isinstance(value, list | tuple):
        return "-".join(_value_text(v) for v in value) or "none"
    if isinstance(value, dict):
        return "-".join(f"{k}{_value_text(v)}" for k, v in sorted(value.items())) or "none"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
