r"""The state of the gpytorch modules a model's predictions depend on.

A model that predicts from quantities computed with shared modules (a kernel, a
likelihood, a mean, transforms) tells whether those modules changed from what is
collected here: the modules in a fixed order with their paths (:func:`_summary_modules`),
their parameters and buffers (:func:`_state_tensors`), a fingerprint of the tensors'
identity, storage and version (:func:`_fingerprint`), and the modules' structure --
paths, types and non-tensor settings such as a Matern kernel's ``nu``
(:func:`_structure`, :func:`_structure_key`, :func:`_settings`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch
from botorch.models.transforms.input import InputTransform
from gpytorch.priors import Prior
from torch import Tensor


def _summary_modules(
    slots: Sequence[tuple[str, torch.nn.Module | None]],
) -> list[tuple[str, torch.nn.Module | None]]:
    r"""The modules whose state a summary depends on, with their paths, in a fixed order.

    Priors are left out (they do not enter the posterior), and so are input transforms
    that do not transform training inputs (``transform_on_train=False``, e.g.
    ``InputPerturbation``): they act on test inputs only.
    """
    out: list[tuple[str, torch.nn.Module | None]] = []
    stack = list(reversed(slots))
    while stack:
        path, module = stack.pop()
        if isinstance(module, Prior):
            continue
        if isinstance(module, InputTransform) and not getattr(module, "transform_on_train", True):
            continue
        out.append((path, module))
        if module is not None:
            children = [(f"{path}.{n}", m) for n, m in module._modules.items() if m is not None]
            stack.extend(reversed(children))
    return out


def _state_tensors(modules: list[tuple[str, torch.nn.Module | None]]) -> list[Tensor]:
    r"""Parameters and buffers of ``modules`` (see :func:`_summary_modules`)."""
    out: list[Tensor] = []
    seen: set[int] = set()
    for _, module in modules:
        if module is None:
            continue
        for t in (*module._parameters.values(), *module._buffers.values()):
            if t is not None and id(t) not in seen:
                seen.add(id(t))
                out.append(t)
    return out


def _fingerprint(tensors: Sequence[Tensor]) -> tuple:
    r"""Identity, storage, version, dtype and device of each tensor: changes whenever a
    tensor is replaced, moved, converted or modified in place (not on ``.data`` writes)."""
    return tuple((id(t), t.data_ptr(), t._version, t.dtype, t.device) for t in tensors)


_SCALARS = (bool, int, float, str, type(None))


def _structure(modules: list[tuple[str, torch.nn.Module | None]]) -> tuple:
    r"""The modules' structure: paths, types and non-tensor settings (e.g. a Matern
    kernel's ``nu``, a transform's flags), as a tuple to compare with ``==``."""
    parts: list[tuple] = []
    for path, module in modules:
        if module is None:
            parts.append((path, None))
            continue
        settings = sorted(
            (k, v if not isinstance(v, tuple) else tuple(v))
            for k, v in vars(module).items()
            if k != "training"
            and (
                isinstance(v, _SCALARS)
                or (isinstance(v, tuple) and all(isinstance(e, _SCALARS) for e in v))
            )
        )
        parts.append((path, type(module).__module__, type(module).__qualname__, tuple(settings)))
    return tuple(parts)


def _structure_key(modules: list[tuple[str, torch.nn.Module | None]]) -> int:
    r"""A stable 63-bit hash of :func:`_structure` (what a model stores in a buffer;
    hashed with each module's settings as a list, the form saved models hold, so they
    still load)."""
    parts = [(*p[:3], list(p[3])) if len(p) == 4 else p for p in _structure(modules)]
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True) >> 1


def _settings(module: torch.nn.Module) -> tuple:
    r"""A module's non-tensor settings (a Matern kernel's ``nu``, flags), sorted."""
    return tuple(
        sorted(
            (k, v)
            for k, v in vars(module).items()
            if k != "training"
            and (
                isinstance(v, _SCALARS)
                or (isinstance(v, tuple) and all(isinstance(e, _SCALARS) for e in v))
            )
        )
    )
