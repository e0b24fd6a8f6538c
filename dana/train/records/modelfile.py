"""The model a run keeps: ``model.safetensors`` in its run directory.

Every ``dana train`` run ends by writing its final model, the parameters of its last
evaluation (the master's, as evaluated: for ``dana-slim`` the look-ahead, which is
what the paper evaluates) and the module's buffers (BatchNorm's running statistics),
as the module's ``state_dict`` in the safetensors format: tensors and a JSON header,
loaded without unpickling any code. The header's metadata says how to build the
module again (``dana``: the model's name and the dataset's shape), so that

    >>> model = load_model("runs/first")  # doctest: +SKIP

gives the trained ``torch.nn.Module`` back, in eval mode; a model dana does not build by
name is loaded into the module your factory builds: ``load_model(path,
model=make_model)``. Tied weights (a language model's output
head and token embedding) are stored once and tied again on loading.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dana.atomic import write_atomic
from dana.errors import DanaError

#: The file's name in a run directory.
MODEL_FILE = "model.safetensors"
_META = "dana"
_TIED = "tied"  # (in the metadata: tied parameter -> the one stored)
_TIED_0_1_0 = "dana.tied"  # (0.1.0 kept the ties in a second metadata entry)


def _import_safetensors() -> Any:
    try:
        import safetensors.torch
    except ImportError:
        raise DanaError(
            "the final model is kept in the safetensors format: pip install safetensors"
        ) from None
    return safetensors.torch


def save_model(path: str | os.PathLike[str], module: nn.Module, info: dict[str, Any]) -> Path:
    """Write ``module``'s ``state_dict`` to ``path`` (a file, or a run directory: its
    :data:`MODEL_FILE`), atomically, with ``info`` (how to build it) in the metadata."""
    st = _import_safetensors()
    path = Path(path)
    if path.is_dir():
        path = path / MODEL_FILE
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple[Any, ...], str] = {}
    for name, value in module.state_dict().items():
        key = (value.data_ptr(), value.dtype, tuple(value.shape), tuple(value.stride()))
        if value.numel() and key in seen:  # tied to a tensor already stored
            aliases[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = value.detach().to("cpu").clone().contiguous()
    # One metadata entry: safetensors writes its entries in no fixed order, and one
    # entry keeps the file's bytes a function of the module alone.
    metadata = {_META: json.dumps({**info, _TIED: aliases}, sort_keys=True)}
    write_atomic(path, st.save(tensors, metadata=metadata))
    return path


def _model_path(path: str | os.PathLike[str]) -> Path:
    path = Path(path)
    if path.is_dir():
        path = path / MODEL_FILE
    if not path.is_file():
        raise DanaError(
            f"{path}: no model file; every `dana train` run writes {MODEL_FILE} when it ends "
            "(a run of an older version, or one still running, has none)"
        )
    return path


#: The integer sizes of a built-in model of each kind, in the metadata.
_SIZES = {"tokens": ("num_classes",), "images": ("in_channels", "image_size", "num_classes")}


def _described(info: dict[str, Any]) -> tuple[str, str, list[int]]:
    """The name, kind and sizes of the built-in model ``info`` describes; DanaError for
    a model dana does not build by name, or a description incomplete or of wrong types."""
    name, kind = info.get("model"), info.get("kind")
    if kind not in _SIZES:
        raise DanaError(
            f"the model {name!r} is not one dana builds by name; pass model= your factory "
            "(a zero-argument function returning the module) or an instance"
        )
    sizes = [info.get(key) for key in _SIZES[kind]]
    if not isinstance(name, str) or any(
        isinstance(n, bool) or not isinstance(n, int) for n in sizes
    ):
        shown = ", ".join(f"{key} {n!r}" for key, n in zip(_SIZES[kind], sizes))
        raise DanaError(
            f"its metadata describes the model {name!r} ({shown}): a model's name and "
            "integer sizes are needed; the file is corrupt"
        )
    return name, kind, sizes


def build_from_info(info: dict[str, Any]) -> nn.Module:
    """A fresh module of the model ``info`` describes (a built-in model's name and the
    data's sizes); DanaError when it describes none."""
    from dana.models import build_language_model, build_model

    name, kind, sizes = _described(info)
    if kind == "tokens":
        return build_language_model(name, *sizes)
    return build_model(name, *sizes)


@contextmanager
def _reading(path: Path) -> Iterator[None]:
    """DanaError naming ``path`` for a file the safetensors reader refuses (truncated, a
    corrupt header, an unknown data type) or that cannot be read."""
    from safetensors import SafetensorError

    try:
        yield
    except (SafetensorError, OSError) as e:
        raise DanaError(
            f"{path}: not a readable model file ({e}): it is truncated or corrupt; copy it "
            "again, or train again"
        ) from None


def _header(path: Path) -> tuple[dict[str, Any], dict[str, str], dict[str, tuple[int, ...]]]:
    """The model's description, its ties (tied parameter -> the one stored) and each
    stored tensor's shape, from the file's header alone; DanaError naming the file for
    any of them malformed."""
    from safetensors import safe_open

    with _reading(path), safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        shapes = {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}
    corrupt = (
        f"{path}: the file is corrupt or not a dana model file (a model of your own loads "
        "with model=): "
    )
    try:
        info = json.loads(meta.get(_META, "{}"))
        old_ties = json.loads(meta.get(_TIED_0_1_0, "{}"))
    except (ValueError, RecursionError):
        raise DanaError(corrupt + "its metadata is not valid JSON") from None
    if not isinstance(info, dict):
        raise DanaError(corrupt + f"its metadata is a {type(info).__name__}, not a mapping")
    aliases = info.pop(_TIED, None) or old_ties
    if not isinstance(aliases, dict) or not all(
        isinstance(target, str) and target in shapes for target in aliases.values()
    ):
        raise DanaError(corrupt + "its tied weights name tensors the file does not hold")
    return info, aliases, shapes


def _built(path: Path, info: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> nn.Module:
    """The module ``info`` describes, built only once the file's tensors (``shapes``,
    tied names included) are known to be its: it is first built on the meta device (no
    memory) and its ``state_dict``'s shapes compared, so that the metadata cannot ask
    for more than the file holds."""
    from dana.models.registry import model_depth

    try:
        name = _described(info)[0]
        layers = model_depth(name)
        if layers > len(shapes):
            raise DanaError(
                f"its metadata describes {name}, of {layers} layers, and the file holds "
                f"{len(shapes)} tensors: the file is corrupt"
            )
        with torch.device("meta"):
            expected = {k: tuple(v.shape) for k, v in build_from_info(info).state_dict().items()}
    except DanaError as e:
        raise DanaError(f"{path}: {e}") from None
    except (RuntimeError, ValueError, TypeError, OverflowError) as e:  # torch's: absurd sizes
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DanaError(
            f"{path}: its metadata describes a model torch cannot build: {first}"
        ) from None
    wrong = [
        f"{k} {list(shapes[k])} (the model's: {list(expected[k])})"
        for k in sorted(expected.keys() & shapes.keys())
        if shapes[k] != expected[k]
    ]
    for what, names in (
        ("missing", sorted(expected.keys() - shapes.keys())),
        ("of another model", sorted(shapes.keys() - expected.keys())),
        ("of other shapes", wrong),
    ):
        if names:
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            raise DanaError(
                f"{path}: the tensors do not fit the model its metadata describes "
                f"({name}): {what}: {', '.join(names[:3])}{more}; the file is corrupt"
            )
    return build_from_info(info)


def load_model(
    run_dir: str | os.PathLike[str],
    model: nn.Module | Callable[[], nn.Module] | None = None,
) -> nn.Module:
    """The trained module of a run directory (or of a model file), in eval mode.

    ``model``: None builds the run's model by its name (every built-in model); a
    ``torch.nn.Module`` (or a zero-argument factory building one) of the same
    architecture receives the saved parameters and buffers instead. DanaError, naming
    the file, when there is no model file, it is truncated or corrupt, or it does not
    fit the module; the metadata's model is checked against the stored tensors' shapes
    before it is built."""
    path = _model_path(run_dir)
    st = _import_safetensors()
    info, aliases, shapes = _header(path)
    if model is None:
        module = _built(path, info, {**shapes, **{k: shapes[t] for k, t in aliases.items()}})
    elif isinstance(model, nn.Module):
        module = model
    else:
        module = model()
        if not isinstance(module, nn.Module):
            raise DanaError(f"model= must build a torch.nn.Module, got {type(module).__name__}")
    with _reading(path):
        tensors = st.load_file(str(path))
    for name, target in aliases.items():
        tensors[name] = tensors[target]
    floats = {t.dtype for t in tensors.values() if t.is_floating_point()}
    if len(floats) == 1:
        module.to(floats.pop())
    try:
        module.load_state_dict(tensors)
    except RuntimeError as e:
        raise DanaError(f"{path}: the saved model does not fit the module: {e}") from None
    return module.eval()
