"""The cluster a simulated run trains on: compute, network and availability, one file.

A cluster model is a YAML mapping (``dana train --cluster FILE_OR_PRESET``; presets in
``dana/presets/clusters/``). Its three sections, every field optional (the defaults give
today's simulator: compute only, free messages, no worker ever away); the unit of
simulated time is the millisecond, bandwidths are in Gbit/s (docs/ALGORITHMS.md, "The
clock, exactly as simulated", says how each field enters the clock)::

    name: datacenter              # the label of the cluster in reports
    description: ...
    compute:                      # each step's time, per worker
      model: gamma                # constant, gamma, lognormal, pareto, heterogeneous, trace
      shape: 100                  # ... and the model's parameters (as --timing-*)
      scale: 1.28
      worker_factors: [1.0]       # worker i's steps take factors[i % n] times longer
      periodic: null              # {amplitude: a, period_ms: P}: x (1 + a sin(2 pi (t/P + i/k)))
      slow_episodes: null         # {every_ms: E, length_ms: L, factor: f}: random slow spells
      class_cost: null            # [c_0, c_1, ...]: x the mean cost of the batch's labels
    network:
      latency_ms: 0               # one-way latency of each worker's link (or a list)
      bandwidth_gbps: null        # each worker's link (or a list); null: no limit
      server_bandwidth_gbps: null # each parameter-server shard's link, shared; null: none
      bytes_per_value: null       # bytes of one parameter on the wire; null: the dtype's
    availability:
      preemptions: []             # [{worker: 3, leave_ms: 60000, rejoin_ms: 90000}, ...]
      random: null                # {mean_up_ms: U, mean_down_ms: D}: each worker, at random

:func:`resolve_cluster` turns a preset name, a file or a mapping into the *resolved*
model: every field present, the compute model's parameters filled in, checked (a
:class:`~dana.errors.ConfigError` names the field and the fix). A run's ``config.json``
holds the resolved model, so that it reruns without the file. :func:`is_trivial` says
whether a model is today's clock (the simulator's fast path).
"""

from __future__ import annotations

import copy
from importlib import resources
from pathlib import Path
from typing import Any

from dana.errors import ConfigError
from dana.textfile import is_number, parse_mapping, read_text
from dana.train.cluster.timing import TIMING_MODELS, build_timing

SECTIONS = ("compute", "network", "availability")
#: The compute section's own fields; any other key is a parameter of the model.
COMPUTE_FIELDS = ("model", "worker_factors", "periodic", "slow_episodes", "class_cost")
NETWORK_FIELDS = ("latency_ms", "bandwidth_gbps", "server_bandwidth_gbps", "bytes_per_value")
AVAILABILITY_FIELDS = ("preemptions", "random")
#: The longest time a cluster field may give (ms): about 3,000 years.
MAX_MS = 1e14


def preset_names() -> list[str]:
    """The shipped cluster presets (``dana/presets/clusters/*.yaml``), sorted."""
    folder = resources.files("dana") / "presets" / "clusters"
    if not folder.is_dir():
        return []
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_cluster_file(value: str) -> dict[str, Any]:
    """The mapping of a preset (by name) or a YAML/JSON file (by path), unchecked."""
    if value in preset_names():
        text = (resources.files("dana") / "presets" / "clusters" / f"{value}.yaml").read_text()
        source, default_name = f"cluster preset {value}", value
    else:
        path = Path(value)
        if not path.is_file():
            raise ConfigError(
                f"--cluster {value!r}: no such preset or file; give a cluster file (YAML) or "
                f"one of the presets: {', '.join(preset_names())}"
            )
        text = read_text(path, "the cluster file")
        source, default_name = f"--cluster {path}", path.stem
    values = parse_mapping(text, source, "a cluster file holds a mapping (compute:, network:, ...)")
    values.setdefault("name", default_name)
    return values


def resolve_cluster(
    value: str | dict[str, Any] | None,
    timing: str = "gamma",
    timing_params: dict[str, Any] | None = None,
    timing_given: bool = False,
) -> dict[str, Any] | None:
    """The resolved cluster model of ``value`` (a preset name, a file, or a mapping);
    ``None`` for no cluster. A model without a compute model takes ``timing`` and
    ``timing_params`` (the run's ``--timing``); a model with one refuses a different
    ``timing`` when ``timing_given`` (the run set it)."""
    if value is None:
        return None
    if isinstance(value, str):
        raw = load_cluster_file(value)
        where = f"cluster {raw['name']!r}"
    elif isinstance(value, dict):
        raw = copy.deepcopy(value)
        where = f"cluster {raw.get('name', '(unnamed)')!r}"
    else:
        raise ConfigError(
            f"--cluster must be a preset name, a cluster file or a mapping, got {value!r}"
        )
    return _Checker(where).cluster(raw, timing, dict(timing_params or {}), timing_given)


def is_trivial(cluster: dict[str, Any] | None) -> bool:
    """Whether ``cluster`` is today's clock: compute times from its model alone (no
    factors, drift or data costs), free messages, no worker ever away."""
    if cluster is None:
        return True
    c, n, a = cluster["compute"], cluster["network"], cluster["availability"]
    return (
        all(f == 1 for f in c["worker_factors"])
        and c["periodic"] is None
        and c["slow_episodes"] is None
        and c["class_cost"] is None
        and all(x == 0 for x in _as_list(n["latency_ms"]))
        and all(x is None for x in _as_list(n["bandwidth_gbps"]))
        and n["server_bandwidth_gbps"] is None
        and not a["preemptions"]
        and a["random"] is None
    )


def timing_of(cluster: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The compute model's name and parameters (as ``--timing`` and ``--timing-*``)."""
    compute = cluster["compute"]
    return compute["model"], {k: v for k, v in compute.items() if k not in COMPUTE_FIELDS}


def cycled(values: Any, worker: int) -> Any:
    """A per-worker field's value for ``worker``: a single value, or a list cycled."""
    if isinstance(values, list):
        return values[worker % len(values)]
    return values


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


class _Checker:
    """Checks a raw cluster mapping field by field; every message names the field."""

    def __init__(self, where: str):
        self.where = where

    def fail(self, field: str, message: str) -> ConfigError:
        return ConfigError(f"{self.where}: {field} {message}")

    def mapping(self, value: Any, field: str, allowed: tuple[str, ...] | None) -> dict:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(field, f"must be a mapping of name: value, got {value!r}")
        if allowed is not None:
            unknown = sorted(set(map(str, value)) - set(allowed))
            if unknown:
                raise self.fail(
                    field,
                    f"has no field {', '.join(unknown)}; its fields are: {', '.join(allowed)} "
                    "(docs/ALGORITHMS.md, 'The clock, exactly as simulated')",
                )
        return dict(value)

    def number(
        self, value: Any, field: str, low: float, *, open_low: bool = False, high: float = MAX_MS
    ) -> float:
        ok = is_number(value)
        if ok:
            ok = (value > low if open_low else value >= low) and value <= high
        if not ok:
            op = ">" if open_low else ">="
            hint = (
                " (a string: in YAML a number in exponent form needs a dot, e.g. 1.0e-4)"
                if isinstance(value, str)
                else ""
            )
            raise self.fail(
                field, f"must be a number {op} {low:g} and <= {high:g}, got {value!r}{hint}"
            )
        return float(value)

    def per_worker(
        self, value: Any, field: str, low: float, *, open_low: bool = False, none: bool = False
    ) -> Any:
        """A number, or a non-empty list of numbers cycled over the workers (``none``:
        null is accepted too, meaning no limit)."""
        if value is None and none:
            return None
        if isinstance(value, list):
            if not value:
                raise self.fail(field, "must be a number or a non-empty list of numbers, got []")
            return [
                self.number(v, f"{field}[{n}]", low, open_low=open_low) for n, v in enumerate(value)
            ]
        return self.number(value, field, low, open_low=open_low)

    # -- the sections ---------------------------------------------------------------------
    def cluster(
        self, raw: dict, timing: str, timing_params: dict, timing_given: bool
    ) -> dict[str, Any]:
        raw = self.mapping(raw, "the cluster", ("name", "description", *SECTIONS))
        name = raw.get("name", "cluster")
        if not isinstance(name, str) or not name.strip():
            raise self.fail("name", f"must be a non-empty string, got {name!r}")
        description = raw.get("description", "")
        if not isinstance(description, str):
            raise self.fail("description", f"must be a string, got {description!r}")
        return {
            "name": name,
            "description": description.strip(),
            "compute": self.compute(raw.get("compute"), timing, timing_params, timing_given),
            "network": self.network(raw.get("network")),
            "availability": self.availability(raw.get("availability")),
        }

    def compute(self, raw: Any, timing: str, timing_params: dict, timing_given: bool) -> dict:
        raw = self.mapping(raw, "compute", None)
        params = {k: v for k, v in raw.items() if k not in COMPUTE_FIELDS}
        if "model" in raw:
            model = raw["model"]
            if model not in TIMING_MODELS:
                raise self.fail(
                    "compute.model",
                    f"{model!r} is unknown; choose one of: {', '.join(TIMING_MODELS)}",
                )
            if timing_given and (timing, timing_params) != (model, params):
                raise ConfigError(
                    f"{self.where}: its compute model ({model}) and --timing {timing} "
                    f"{timing_params or ''} both set the step times; drop --timing and "
                    "--timing-*, or the cluster's compute.model and its parameters"
                )
        else:
            if params:
                raise self.fail(
                    "compute",
                    f"gives parameters ({', '.join(sorted(params))}) but no model: "
                    "add `model: NAME`",
                )
            model, params = timing, dict(timing_params)
        try:  # the model's own checks, its defaults filled in (one worker: no draws kept)
            built = build_timing(model, 1, 0, **params)
        except ConfigError as e:
            raise self.fail("compute", f"(model {model}): {e}") from None
        resolved: dict[str, Any] = {"model": model, **built.params()}
        factors = raw.get("worker_factors", [1.0])
        resolved["worker_factors"] = _as_list(
            self.per_worker(factors, "compute.worker_factors", 0, open_low=True)
        )
        resolved["periodic"] = self.periodic(raw.get("periodic"))
        resolved["slow_episodes"] = self.episodes(raw.get("slow_episodes"))
        cost = raw.get("class_cost")
        if cost is not None:
            if not isinstance(cost, list) or not cost:
                raise self.fail(
                    "compute.class_cost",
                    f"must be a list of per-class cost factors (> 0), one per class, got {cost!r}",
                )
            cost = [
                self.number(c, f"compute.class_cost[{n}]", 0, open_low=True)
                for n, c in enumerate(cost)
            ]
        resolved["class_cost"] = cost
        return resolved

    def periodic(self, raw: Any) -> dict | None:
        if raw is None:
            return None
        raw = self.mapping(raw, "compute.periodic", ("amplitude", "period_ms"))
        for key in ("amplitude", "period_ms"):
            if key not in raw:
                raise self.fail(f"compute.periodic.{key}", "is missing (periodic drift needs both)")
        amplitude = self.number(raw["amplitude"], "compute.periodic.amplitude", 0, high=0.999999)
        period = self.number(raw["period_ms"], "compute.periodic.period_ms", 0, open_low=True)
        return {"amplitude": amplitude, "period_ms": period}

    def episodes(self, raw: Any) -> dict | None:
        if raw is None:
            return None
        keys = ("every_ms", "length_ms", "factor")
        raw = self.mapping(raw, "compute.slow_episodes", keys)
        for key in keys:
            if key not in raw:
                raise self.fail(f"compute.slow_episodes.{key}", "is missing")
        return {
            "every_ms": self.number(
                raw["every_ms"], "compute.slow_episodes.every_ms", 0, open_low=True
            ),
            "length_ms": self.number(
                raw["length_ms"], "compute.slow_episodes.length_ms", 0, open_low=True
            ),
            "factor": self.number(raw["factor"], "compute.slow_episodes.factor", 1, high=1e6),
        }

    def network(self, raw: Any) -> dict:
        raw = self.mapping(raw, "network", NETWORK_FIELDS)
        value_bytes = raw.get("bytes_per_value")
        return {
            "latency_ms": self.per_worker(raw.get("latency_ms", 0.0), "network.latency_ms", 0),
            "bandwidth_gbps": self.per_worker(
                raw.get("bandwidth_gbps"), "network.bandwidth_gbps", 0, open_low=True, none=True
            ),
            "server_bandwidth_gbps": None
            if raw.get("server_bandwidth_gbps") is None
            else self.number(
                raw["server_bandwidth_gbps"], "network.server_bandwidth_gbps", 0, open_low=True
            ),
            "bytes_per_value": None
            if value_bytes is None
            else self.number(value_bytes, "network.bytes_per_value", 0, open_low=True, high=1e9),
        }

    def availability(self, raw: Any) -> dict:
        raw = self.mapping(raw, "availability", AVAILABILITY_FIELDS)
        entries = raw.get("preemptions") or []
        if not isinstance(entries, list):
            raise self.fail(
                "availability.preemptions",
                f"must be a list of {{worker, leave_ms, rejoin_ms}}, got {entries!r}",
            )
        preemptions = [self.preemption(e, n) for n, e in enumerate(entries)]
        by_worker: dict[int, list[dict]] = {}
        for p in preemptions:
            by_worker.setdefault(p["worker"], []).append(p)
        for worker, spells in by_worker.items():
            spells.sort(key=lambda p: p["leave_ms"])
            for a, b in zip(spells, spells[1:]):
                if a["rejoin_ms"] is None or a["rejoin_ms"] >= b["leave_ms"]:
                    raise self.fail(
                        "availability.preemptions",
                        f"has overlapping spells for worker {worker} (leaving at "
                        f"{a['leave_ms']:g} and {b['leave_ms']:g} ms): a worker leaves again "
                        "only after it has rejoined",
                    )
        preemptions.sort(key=lambda p: (p["leave_ms"], p["worker"]))
        random = raw.get("random")
        if random is not None:
            random = self.mapping(random, "availability.random", ("mean_up_ms", "mean_down_ms"))
            for key in ("mean_up_ms", "mean_down_ms"):
                if key not in random:
                    raise self.fail(f"availability.random.{key}", "is missing")
            random = {
                key: self.number(random[key], f"availability.random.{key}", 0, open_low=True)
                for key in ("mean_up_ms", "mean_down_ms")
            }
            if preemptions:
                raise self.fail(
                    "availability",
                    "gives both preemptions and random: choose one (given times, or at random)",
                )
        return {"preemptions": preemptions, "random": random}

    def preemption(self, raw: Any, n: int) -> dict:
        field = f"availability.preemptions[{n}]"
        raw = self.mapping(raw, field, ("worker", "leave_ms", "rejoin_ms"))
        worker = raw.get("worker")
        if isinstance(worker, bool) or not isinstance(worker, int) or worker < 0:
            raise self.fail(f"{field}.worker", f"must be a worker index >= 0, got {worker!r}")
        if "leave_ms" not in raw:
            raise self.fail(f"{field}.leave_ms", "is missing (when the worker leaves, in ms)")
        leave = self.number(raw["leave_ms"], f"{field}.leave_ms", 0, open_low=True)
        rejoin = raw.get("rejoin_ms")
        if rejoin is not None:
            rejoin = self.number(rejoin, f"{field}.rejoin_ms", leave, open_low=True)
        return {"worker": worker, "leave_ms": leave, "rejoin_ms": rejoin}


def check_workers(cluster: dict[str, Any] | None, workers: int) -> None:
    """ConfigError if the cluster names a worker a run of ``workers`` does not have, or
    sends every worker away for good (the run could never end)."""
    if cluster is None:
        return
    where = f"cluster {cluster['name']!r}"
    spells = cluster["availability"]["preemptions"]
    for n, p in enumerate(spells):
        if p["worker"] >= workers:
            raise ConfigError(
                f"{where}: availability.preemptions[{n}].worker is {p['worker']}, but the run "
                f"has {workers} workers (0 to {workers - 1}); remove the entry or raise --workers"
            )
    gone = {p["worker"] for p in spells if p["rejoin_ms"] is None}
    if len(gone) == workers:
        raise ConfigError(
            f"{where}: availability.preemptions sends every worker away for good (no "
            "rejoin_ms): the run could never end; give one of them a rejoin_ms"
        )


def check_cluster_option(
    config: Any, backend: Any, synchronous: bool, timing_given: bool, flag: Any
) -> dict[str, Any]:
    """The resolved cluster of a run's ``cluster`` option (a preset, a file or a
    mapping; a cluster without a compute model takes the run's ``timing``), checked
    against the run: its workers, and a backend that can run it (the simulator; Ray
    emulating it with ``time_scale > 0``, without departures for a synchronous
    algorithm). ``timing_given``: the run set its timing (a cluster's own compute model
    then refuses another); ``flag(name)``: how the caller names an option."""
    cluster = resolve_cluster(config.cluster, config.timing, config.timing_params, timing_given)
    check_workers(cluster, config.workers)
    name = cluster["name"]
    if backend.cluster_model:
        return cluster
    if backend.emulates_cluster and config.time_scale > 0:
        away = cluster["availability"]
        if synchronous and (away["preemptions"] or away["random"]):
            raise ConfigError(
                f"{flag('cluster')} {name}: {config.algorithm}'s rounds on "
                f"{flag('backend')} {config.backend} are driven for a fixed set of workers, "
                "so its workers cannot leave and return; drop the cluster's availability, "
                f"or simulate it ({flag('backend')} sim)"
            )
        return cluster
    if backend.emulates_cluster:
        raise ConfigError(
            f"{flag('cluster')} {name}: {flag('backend')} {config.backend} emulates a "
            f"cluster model in real time: pass {flag('time_scale')} S > 0 (the seconds one "
            "model millisecond lasts, e.g. 0.001)"
        )
    raise ConfigError(
        f"{flag('cluster')} {name}: a cluster model is simulated ({flag('backend')} sim); "
        f"{flag('backend')} {config.backend} runs on a cluster of its own (emulate step "
        f"times with {flag('timing')} and {flag('time_scale')})"
    )
