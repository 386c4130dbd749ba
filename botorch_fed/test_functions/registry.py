r"""Look up test functions by name: ours (CEC-2005, Co-KG, LDP-BO) and every BoTorch one.

Names are matched case-insensitively, ignoring ``-``, ``_`` and spaces:
``"cec2005-f1"`` ... ``"cec2005-f20"``, ``"cokg-f1"`` (alias ``"cokg-sincos"``),
``"cokg-f2"`` (alias ``"cokg-rosenbrock"``), ``"ldp-synthetic"`` (alias
``"ldp-synthetic-se"``; the SE-kernel function of [LDP-BO] Sec. 5.1) and
``"ldp-synthetic-matern"`` (its Matern-2.5 variant), ``"l1-regression"``
(least-absolute-deviations regression of [FedZero],
:class:`~botorch_fed.test_functions.l1_regression.L1Regression`; ``dim`` default
100), and the class name of any concrete
BoTorch ``SyntheticTestFunction`` exported by ``botorch.test_functions`` or defined in
``botorch.test_functions.synthetic`` / ``.multi_fidelity`` (``"hartmann"``,
``"levy"``, ``"ackley"``, ``"branin"``, ``"rosenbrock"``, ``"styblinski_tang"``, ...).

A BoTorch function built with a ``seed`` (or ``generator``) is an instance of a
subclass ``Seeded<Name>`` (defined on demand in this module, so it pickles) whose
observation noise comes from a private ``torch.Generator``; it is still an instance
of the BoTorch class.

References:

.. [LDP-BO] X. Zhou, J. Tan. Local differential privacy for Bayesian optimization
   (paper 002 in ``shared/papers``), Sec. 5.1.
.. [FedZero] A. Akhavan, D. Janz, E.-M. El-Mhamdi. High-probability analysis of online
   and federated zero-order optimisation (paper 004 in ``shared/papers``), Sec. 2.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import botorch.test_functions as botorch_test_functions
import botorch.test_functions.multi_fidelity as botorch_multi_fidelity
import botorch.test_functions.synthetic as botorch_synthetic
import torch
from botorch.test_functions.synthetic import SyntheticTestFunction

from botorch_fed.test_functions.base import SeededNoiseMixin
from botorch_fed.test_functions.cec2005 import CEC2005_FUNCTIONS
from botorch_fed.test_functions.cokg import CoKGRosenbrock, CoKGSinCosBowl
from botorch_fed.test_functions.l1_regression import L1Regression
from botorch_fed.test_functions.ldp_synthetic import LDPSynthetic

# Dimensions that BoTorch classes accept although their constructor takes ``dim``.
_KNOWN_DIMS: dict[str, tuple[int, ...]] = {
    "Hartmann": (3, 4, 6),
    "ConstrainedHartmann": (3, 4, 6),
    "ConstrainedHartmannSmooth": (3, 4, 6),
}


def _normalize(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch not in "-_ ")


def _cec_names() -> dict[str, str]:
    return {f"cec2005-f{n}": f"cec2005-f{n}" for n in CEC2005_FUNCTIONS}


_COKG: dict[str, type[SyntheticTestFunction]] = {
    "cokg-f1": CoKGSinCosBowl,
    "cokg-f2": CoKGRosenbrock,
}
_COKG_ALIASES = {"cokg-sincos": "cokg-f1", "cokg-rosenbrock": "cokg-f2"}

# [LDP-BO] Sec. 5.1: name -> the kernel arguments of LDPSynthetic
_LDP: dict[str, dict[str, Any]] = {
    "ldp-synthetic": {"kernel": "se"},
    "ldp-synthetic-matern": {"kernel": "matern", "nu": 2.5},
}
_LDP_ALIASES = {"ldp-synthetic-se": "ldp-synthetic"}

# [FedZero]: least-absolute-deviations regression (convex, Lipschitz, stochastic)
_CONVEX: dict[str, type[SyntheticTestFunction]] = {"l1-regression": L1Regression}


@lru_cache(maxsize=1)
def _botorch_classes() -> dict[str, type[SyntheticTestFunction]]:
    r"""Normalised class name -> concrete BoTorch ``SyntheticTestFunction`` class."""
    found: dict[str, type[SyntheticTestFunction]] = {}
    for module in (botorch_test_functions, botorch_synthetic, botorch_multi_fidelity):
        for attr in dir(module):
            obj = getattr(module, attr)
            if (
                inspect.isclass(obj)
                and issubclass(obj, SyntheticTestFunction)
                and not inspect.isabstract(obj)
                and obj.__module__.startswith("botorch.")
            ):
                found.setdefault(_normalize(obj.__name__), obj)
    return found


def list_test_functions() -> list[str]:
    r"""Canonical names accepted by :func:`get_test_function`.

    Returns:
        ``cec2005-f1`` ... ``cec2005-f20``, ``cokg-f1``, ``cokg-f2``,
        ``ldp-synthetic``, ``ldp-synthetic-matern``, ``l1-regression``, then the
        BoTorch functions as lower-case class names, sorted.
    """
    ours = [f"cec2005-f{n}" for n in sorted(CEC2005_FUNCTIONS)] + sorted(_COKG) + sorted(_LDP)
    ours += sorted(_CONVEX)
    return ours + sorted(_botorch_classes())


def _lookup_table() -> dict[str, tuple[str, type[SyntheticTestFunction]]]:
    table: dict[str, tuple[str, Any]] = {}
    for key, cls in _botorch_classes().items():
        table[key] = (key, cls)
    for n, cls in CEC2005_FUNCTIONS.items():
        table[_normalize(f"cec2005-f{n}")] = (f"cec2005-f{n}", cls)
    for name, cls in _COKG.items():
        table[_normalize(name)] = (name, cls)
    for alias, name in _COKG_ALIASES.items():
        table[_normalize(alias)] = (name, _COKG[name])
    for name in _LDP:
        table[_normalize(name)] = (name, LDPSynthetic)
    for alias, name in _LDP_ALIASES.items():
        table[_normalize(alias)] = (name, LDPSynthetic)
    for name, cls in _CONVEX.items():
        table[_normalize(name)] = (name, cls)
    return table


def _resolve(name: str) -> tuple[str, type[SyntheticTestFunction]]:
    r"""``(canonical name, class)`` of a test function name, or a ``ValueError``
    listing close matches."""
    if not isinstance(name, str):
        raise TypeError(f"`name` must be a str; got {type(name).__name__}.")
    table = _lookup_table()
    key = _normalize(name)
    if key not in table:
        close = difflib.get_close_matches(key, list(table), n=5, cutoff=0.6)
        hint = list(dict.fromkeys(table[c][0] for c in close))
        suggestion = f" Did you mean: {', '.join(hint)}?" if hint else ""
        raise ValueError(
            f"Unknown test function name {name!r}.{suggestion} "
            "See `list_test_functions()` for all names."
        )
    return table[key]


def get_test_function_class(name: str) -> type[SyntheticTestFunction]:
    r"""The class :func:`get_test_function` builds for ``name`` (the BoTorch class
    itself, not its ``Seeded<Name>`` subclass).

    Raises:
        ValueError: For an unknown name (listing close matches).
    """
    return _resolve(name)[1]


def get_test_function(
    name: str,
    dim: int | None = None,
    noise_std: float | None = None,
    negate: bool = False,
    seed: int | None = None,
    **kwargs: Any,
) -> SyntheticTestFunction:
    r"""Build a synthetic test function by name.

    Args:
        name: ``"cec2005-f1"`` ... ``"cec2005-f20"``, ``"cokg-f1"``, ``"cokg-f2"``,
            ``"ldp-synthetic"``, ``"ldp-synthetic-matern"``, ``"l1-regression"``
            (``dim`` default 100; ``function_seed``, ``num_data``, ``sparsity``,
            ``data_noise`` as keyword arguments) or a BoTorch
            ``SyntheticTestFunction`` class name; case-insensitive, ``-``, ``_`` and
            spaces are ignored.
        dim: Input dimension. ``None``: the function's default (10 for CEC-2005).
            For a fixed-dimension function it must equal that dimension.
        noise_std: Standard deviation of additive Gaussian observation noise.
        negate: If True, negate the function (maximisation).
        seed: Seed of a private ``torch.Generator`` for all noise of the function
            (CEC-2005 F4/F17's own noise and ``noise_std``); ``None``: global RNG.
        **kwargs: Passed to the constructor (``bounds``, ``dtype``, ``generator``,
            ``fitness_noise`` for F4/F17, ``m`` for Shekel, ``function_seed``,
            ``lengthscale``, ``num_points``, ... for the LDP-BO functions, ...).

    Returns:
        The test function (a ``SyntheticTestFunction``).

    Raises:
        ValueError: For an unknown name (listing close matches) or a ``dim`` the
            function does not support.
        ImportError: For CEC-2005 functions without ``botorch-fed[cec]``.
    """
    canonical, cls = _resolve(name)
    # our classes take keyword arguments (``seed``, ...) SyntheticTestFunction lacks
    make: Callable[..., SyntheticTestFunction] = cls
    if cls in CEC2005_FUNCTIONS.values():
        return make(
            dim=10 if dim is None else dim,
            noise_std=noise_std,
            negate=negate,
            seed=seed,
            **kwargs,
        )
    if cls in _COKG.values():
        _check_fixed_dim(canonical, dim, 2)
        return make(noise_std=noise_std, negate=negate, seed=seed, **kwargs)
    if cls is LDPSynthetic:
        _check_fixed_dim(canonical, dim, 1)
        ctor = dict(_LDP[canonical])
        for key, value in ctor.items():
            if key in kwargs and kwargs[key] != value:
                raise ValueError(
                    f"Test function {canonical!r} has `{key}`={value!r}; got "
                    f"`{key}`={kwargs[key]!r} (use the other ldp-synthetic name)."
                )
        ctor.update(kwargs)
        return cls(noise_std=noise_std, negate=negate, seed=seed, **ctor)
    if cls is L1Regression:
        return cls(
            dim=100 if dim is None else dim,
            noise_std=noise_std,
            negate=negate,
            seed=seed,
            **kwargs,
        )
    return _build_botorch(cls, canonical, dim, noise_std, negate, seed, kwargs)


def _check_fixed_dim(name: str, dim: int | None, fixed: int) -> None:
    if dim is not None and dim != fixed:
        raise ValueError(f"Test function {name!r} has fixed dimension {fixed}; got dim={dim}.")


def _build_botorch(
    cls: type[SyntheticTestFunction],
    name: str,
    dim: int | None,
    noise_std: float | None,
    negate: bool,
    seed: int | None,
    kwargs: dict[str, Any],
) -> SyntheticTestFunction:
    params = inspect.signature(cls.__init__).parameters
    ctor: dict[str, Any] = {"negate": negate, **kwargs}
    if "dim" in params:
        supported = _KNOWN_DIMS.get(cls.__name__)
        if dim is not None and supported is not None and dim not in supported:
            raise ValueError(f"Test function {name!r} supports dim in {supported}; got dim={dim}.")
        if dim is not None:
            ctor["dim"] = dim
        elif params["dim"].default is inspect.Parameter.empty:
            raise ValueError(f"Test function {name!r} needs `dim`; got dim=None.")
    else:
        _check_fixed_dim(name, dim, int(cls.dim))
    if noise_std is not None:
        if "noise_std" not in params:
            raise ValueError(f"Test function {name!r} does not support `noise_std`.")
        ctor["noise_std"] = noise_std
    generator = ctor.pop("generator", None)
    if seed is not None or generator is not None:
        cls = seeded_class(cls)
        ctor["seed"], ctor["generator"] = seed, generator
    try:
        return cls(**ctor)
    except (ValueError, AssertionError) as err:
        if dim is None:
            raise
        raise ValueError(
            f"Test function {name!r} could not be built with dim={dim}: {err}"
        ) from err


class _SeededBoTorchMixin(SeededNoiseMixin):
    r"""Seeded noise for an existing BoTorch class (validation left to BoTorch)."""

    def __init__(
        self,
        *args: Any,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._init_noise_rng(seed=seed, generator=generator)

    def evaluate_true(self, X: torch.Tensor) -> torch.Tensor:
        # Keep the BoTorch class's own evaluate_true (and its input validation).
        return super(SeededNoiseMixin, self).evaluate_true(X)


def seeded_class(cls: type[SyntheticTestFunction]) -> type[SyntheticTestFunction]:
    r"""``Seeded<Name>``: ``cls`` whose noise comes from a private generator.

    The subclass accepts ``seed=`` / ``generator=`` in its constructor and is
    registered as an attribute of this module (so instances pickle).
    """
    name = f"Seeded{cls.__name__}"
    existing = globals().get(name)
    if existing is not None:
        return existing
    new_cls = type(
        name,
        (_SeededBoTorchMixin, cls),
        {"__module__": __name__, "__qualname__": name, "__doc__": cls.__doc__},
    )
    globals()[name] = new_cls
    return new_cls


def __getattr__(name: str) -> Any:
    # Re-create ``Seeded<Name>`` classes on demand (e.g. when unpickling).
    if name.startswith("Seeded"):
        for cls in _botorch_classes().values():
            if cls.__name__ == name[len("Seeded") :]:
                return seeded_class(cls)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["get_test_function", "list_test_functions", "seeded_class", "get_test_function_class"]
