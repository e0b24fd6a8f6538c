"""Every algorithm as a pair of rules over flat tensors, found by name.

Example::

    >>> import dana.algorithms as A
    >>> A.build("dana-slim", momentum=0.9)
    DanaSlim(momentum=0.9)
    >>> sorted(A.ALGORITHMS)[:3]
    ['asgd', 'dana-dc', 'dana-easgd']
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from typing import Any

from dana.algorithms.asgd import Asgd, MultiAsgd, NagAsgd
from dana.algorithms.base import Algorithm, MasterRule, WorkerRule
from dana.algorithms.dana import DanaDc, DanaGa, DanaSlim, DanaZero
from dana.algorithms.dana_easgd import DanaEasgd
from dana.algorithms.dc_asgd import DcAsgd
from dana.algorithms.delay import DelayAdaptiveAsgd, RingmasterAsgd
from dana.algorithms.diloco import Diloco
from dana.algorithms.easgd import Eamsgd, Easgd
from dana.algorithms.gap_aware import GapAware
from dana.algorithms.local_sgd import DanaLocal, LocalDelayedNesterov, LocalNesterov, LocalSgd
from dana.algorithms.lwp import LwpAsgd
from dana.algorithms.ormo import OrMo, OrMoDa, OrMoDaPush, OrMoPush
from dana.algorithms.sa_asgd import SaAsgd
from dana.algorithms.smega2 import Smega2
from dana.algorithms.ssgd import Ssgd
from dana.algorithms.yellowfin import YellowFin, YellowFinClosedLoop

ALGORITHMS: dict[str, type[Algorithm]] = {
    cls.name: cls
    for cls in (
        Ssgd,
        Asgd,
        NagAsgd,
        MultiAsgd,
        DcAsgd,
        GapAware,
        DanaZero,
        DanaSlim,
        DanaDc,
        DanaGa,
        SaAsgd,
        YellowFin,
        YellowFinClosedLoop,
        Easgd,
        Eamsgd,
        DanaEasgd,
        LocalSgd,
        LocalNesterov,
        LocalDelayedNesterov,
        DanaLocal,
        Diloco,
        OrMo,
        OrMoDa,
        OrMoPush,
        OrMoDaPush,
        Smega2,
        RingmasterAsgd,
        DelayAdaptiveAsgd,
        LwpAsgd,
    )
}


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Add an algorithm to the registry (usable as a class decorator)."""
    if cls.name in ALGORITHMS and ALGORITHMS[cls.name] is not cls:
        raise ValueError(f"an algorithm named {cls.name!r} is already registered")
    ALGORITHMS[cls.name] = cls
    return cls


def did_you_mean(name: str) -> str:
    """``" (did you mean 'dana-slim'?)"`` for a name close to a registered one, else ``""``."""
    close = difflib.get_close_matches(str(name).lower(), list(ALGORITHMS), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def get(name: str) -> type[Algorithm]:
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ValueError(
            f"unknown algorithm {name!r}{did_you_mean(name)}; choose one of: "
            f"{', '.join(ALGORITHMS)}"
        ) from None


def hparam_names(name: str) -> list[str]:
    """The hyper-parameters of ``name``: its dataclass fields, in order."""
    return [f.name for f in dataclasses.fields(get(name))]


def hparam_defaults(name: str) -> dict[str, Any]:
    """Each hyper-parameter of ``name`` and its default value."""
    return {f.name: f.default for f in dataclasses.fields(get(name))}


def hparam_types(name: str) -> dict[str, Any]:
    """Each hyper-parameter of ``name`` and its declared type (``float``, ``int | None``,
    ...), the field annotations resolved."""
    cls = get(name)
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def build(name: str, **hparams: Any) -> Algorithm:
    """Build the algorithm ``name`` with the given hyper-parameters (validated)."""
    cls = get(name)
    unknown = sorted(set(hparams) - set(hparam_names(name)))
    if unknown:
        raise ValueError(
            f"{name} takes no hyper-parameter {', '.join(map(repr, unknown))}; "
            f"it takes: {', '.join(hparam_names(name)) or 'none'}"
        )
    return cls(**hparams)


__all__ = [
    "ALGORITHMS",
    "Algorithm",
    "MasterRule",
    "WorkerRule",
    "build",
    "did_you_mean",
    "get",
    "hparam_defaults",
    "hparam_names",
    "hparam_types",
    "register",
]
