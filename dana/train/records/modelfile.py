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
from collections.abc import Callable
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


def build_from_info(info: dict[str, Any]) -> nn.Module:
    """A fresh module of the model ``info`` describes (a built-in model's name)."""
    from dana.models import build_language_model, build_model

    name = info.get("model")
    if info.get("kind") == "tokens":
        return build_language_model(name, info["num_classes"])
    if info.get("kind") == "images":
        return build_model(name, info["in_channels"], info["image_size"], info["num_classes"])
    raise DanaError(
        f"the model {name!r} is not one dana builds by name; pass model= your factory "
        "(a zero-argument function returning the module) or an instance"
    )


def load_model(
    run_dir: str | os.PathLike[str],
    model: nn.Module | Callable[[], nn.Module] | None = None,
) -> nn.Module:
    """The trained module of a run directory (or of a model file), in eval mode.

    ``model``: None builds the run's model by its name (every built-in model); a
    ``torch.nn.Module`` (or a zero-argument factory building one) of the same
    architecture receives the saved parameters and buffers instead. DanaError when
    there is no model file or it does not fit the module."""
    path = _model_path(run_dir)
    st = _import_safetensors()
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    info = json.loads(meta.get(_META, "{}"))
    aliases = info.pop(_TIED, None) or json.loads(meta.get(_TIED_0_1_0, "{}"))
    if model is None:
        module = build_from_info(info)
    elif isinstance(model, nn.Module):
        module = model
    else:
        module = model()
        if not isinstance(module, nn.Module):
            raise DanaError(f"model= must build a torch.nn.Module, got {type(module).__name__}")
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
