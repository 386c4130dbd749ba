r"""Official CEC-2005 data (shift vectors, rotation / linear transformation matrices).

The CEC-2005 suite [CEC2005]_ is defined by data files that were distributed with the
reference C/Matlab/Java code. This module reads them from the ``data_2005`` folder
of the PyPI package ``opfunu-core`` (import name ``opfunu``; the older ``opfunu``
distribution ships byte-identical files) with numpy, applies the modifications
that the report prescribes on top of the files (optimum on the bounds for F5, F8
and F20, ``o_10 = 0`` for F18-F20) and caches the result per (function, dim).
Only opfunu's *files* are used, never its function classes.

opfunu ships the 10-, 30- and 50-D matrices but not the 2-D ones
(``*_M_D2.txt`` of the original distribution). The official 2-D matrices are
embedded in the BSD-licensed PyPI package ``optproblems`` (a reimplementation of
the reference Java code by S. Wessing, verified against the official test data);
they are read from its class attributes (again: data only, not its functions) for
the rotated functions in ``dim=2``. Its 10/30/50-D matrices and all shift vectors
agree bit for bit with opfunu's files.

Both packages form the optional extra ``botorch-fed[cec]``; nothing here is
imported at module import time.

Files read (all under ``opfunu/cec_based/data_2005/``):

==========  ============================================  ==========================
function    shift / parameters                            matrix (``D`` = dim)
==========  ============================================  ==========================
F1          ``data_sphere.txt``                           --
F2, F4      ``data_schwefel_102.txt``                     --
F3          ``data_high_cond_elliptic_rot.txt``           ``elliptic_M_DD.txt``
F5          ``data_schwefel_206.txt`` (o; A)              --
F6          ``data_rosenbrock.txt``                       --
F7          ``data_griewank.txt``                         ``griewank_M_DD.txt``
F8          ``data_ackley.txt``                           ``ackley_M_DD.txt``
F9          ``data_rastrigin.txt``                        --
F10         ``data_rastrigin.txt``                        ``rastrigin_M_DD.txt``
F11         ``data_weierstrass.txt``                      ``weierstrass_M_DD.txt``
F12         ``data_schwefel_213.txt`` (a; b; alpha)       --
F13         ``data_EF8F2.txt``                            --
F14         ``data_E_ScafferF6.txt``                      ``E_ScafferF6_M_DD.txt``
F15         ``data_hybrid_func1.txt`` (10 optima)         identity (per the report)
F16, F17    ``data_hybrid_func1.txt``                     ``hybrid_func1_M_DD.txt``
F18-F20     ``data_hybrid_func2.txt``                     ``hybrid_func2_M_DD.txt``
==========  ============================================  ==========================

References:

.. [CEC2005] P. N. Suganthan, N. Hansen, J. J. Liang, K. Deb, Y.-P. Chen, A. Auger,
   S. Tiwari. Problem definitions and evaluation criteria for the CEC 2005 special
   session on real-parameter optimization. KanGAL report 2005005, 2005.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import numpy as np

SUPPORTED_DIMS: tuple[int, ...] = (2, 10, 30, 50)
INSTALL_HINT = "pip install botorch-fed[cec]"

# Shift-vector file of each function (100 entries per row; composition functions
# have 10 rows, one optimum per component function).
_SHIFT_FILES: dict[int, str] = {
    1: "data_sphere.txt",
    2: "data_schwefel_102.txt",
    3: "data_high_cond_elliptic_rot.txt",
    4: "data_schwefel_102.txt",
    5: "data_schwefel_206.txt",
    6: "data_rosenbrock.txt",
    7: "data_griewank.txt",
    8: "data_ackley.txt",
    9: "data_rastrigin.txt",
    10: "data_rastrigin.txt",
    11: "data_weierstrass.txt",
    12: "data_schwefel_213.txt",
    13: "data_EF8F2.txt",
    14: "data_E_ScafferF6.txt",
    15: "data_hybrid_func1.txt",
    16: "data_hybrid_func1.txt",
    17: "data_hybrid_func1.txt",
    18: "data_hybrid_func2.txt",
    19: "data_hybrid_func2.txt",
    20: "data_hybrid_func2.txt",
}

# Prefix of the dim-specific matrix file (``{prefix}_M_D{dim}.txt``).
_MATRIX_PREFIX: dict[int, str] = {
    3: "elliptic",
    7: "griewank",
    8: "ackley",
    10: "rastrigin",
    11: "weierstrass",
    14: "E_ScafferF6",
    16: "hybrid_func1",
    17: "hybrid_func1",
    18: "hybrid_func2",
    19: "hybrid_func2",
    20: "hybrid_func2",
}

# Where the official 2-D matrices live in ``optproblems``: (module, class, attribute).
_OPTPROBLEMS_2D: dict[int, tuple[str, str, str]] = {
    3: ("optproblems.cec2005.unimodal", "F3", "matrix2D"),
    7: ("optproblems.cec2005.basic_multimodal", "F7", "matrix2D"),
    8: ("optproblems.cec2005.basic_multimodal", "F8", "matrix2D"),
    10: ("optproblems.cec2005.basic_multimodal", "F10", "matrix2D"),
    11: ("optproblems.cec2005.basic_multimodal", "F11", "matrix2D"),
    14: ("optproblems.cec2005.expanded_multimodal", "F14", "matrix2D"),
    16: ("optproblems.cec2005.f16", "F16", "matrices2D"),
    17: ("optproblems.cec2005.f16", "F16", "matrices2D"),
    18: ("optproblems.cec2005.f18", "F18", "matrices2D"),
    19: ("optproblems.cec2005.f18", "F18", "matrices2D"),
    20: ("optproblems.cec2005.f18", "F18", "matrices2D"),
}

_COMPOSITION = frozenset(range(15, 21))


@dataclass(frozen=True)
class CEC2005Data:
    r"""The data that defines one CEC-2005 function in one dimension.

    All arrays are float64 and read-only.

    Attributes:
        number: The function number ``n`` of ``Fn``.
        dim: The input dimension ``D``.
        shift: ``D`` (F1-F14) or ``10 x D`` (F15-F20, one optimum per component)
            shift vector(s) ``o`` after the report's modifications.
        matrix: ``D x D`` matrix ``M`` (rotated F3-F14), ``10 x D x D`` matrices
            ``M_i`` (F15-F20; identity for F15) or ``None``.
        optimum: ``D`` global minimiser (``o``, ``o_1`` for the compositions,
            ``alpha`` for F12).
        extra: Further parameters: ``A`` (F5, ``D x D``); ``a``, ``b`` (``D x D``)
            and ``alpha`` (``D``) for F12.
        sources: Human-readable provenance of every array (file names).
    """

    number: int
    dim: int
    shift: np.ndarray
    matrix: np.ndarray | None
    optimum: np.ndarray
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    sources: tuple[str, ...] = ()


def validate_dim(number: int, dim: int) -> None:
    r"""Raise a ``ValueError`` naming ``dim`` unless it is a supported dimension."""
    if isinstance(dim, bool) or not isinstance(dim, int | np.integer):
        raise ValueError(
            f"CEC-2005 F{number}: `dim` must be an int in {SUPPORTED_DIMS}; "
            f"got dim={dim!r} of type {type(dim).__name__}."
        )
    if int(dim) not in SUPPORTED_DIMS:
        raise ValueError(
            f"CEC-2005 F{number} is only defined for dim in {SUPPORTED_DIMS} (the "
            f"dimensions of the official rotation matrices); got dim={dim}."
        )


def opfunu_data_dir() -> Path:
    r"""Folder ``cec_based/data_2005`` of the installed ``opfunu`` package.

    Located with ``importlib.util.find_spec`` so that ``opfunu`` itself is never
    imported (its import is slow and not needed: only its data files are used).

    Raises:
        ImportError: If neither ``opfunu-core`` nor ``opfunu`` is installed, or the
            installed version has no CEC-2005 data.
    """
    try:
        spec = importlib.util.find_spec("opfunu")
    except (ImportError, ValueError):  # broken install or blocked import
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "The CEC-2005 test functions read their official shift vectors and "
            "rotation matrices from the data files of the `opfunu-core` package, "
            f"which is not installed. Install the optional extra: `{INSTALL_HINT}`."
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / "cec_based" / "data_2005"
        if (candidate / "data_sphere.txt").is_file():
            return candidate
    raise ImportError(
        "The installed `opfunu` package has no CEC-2005 data files "
        f"(cec_based/data_2005); reinstall it with `{INSTALL_HINT}`."
    )


@cache
def _load_txt(name: str) -> np.ndarray:
    path = opfunu_data_dir() / name
    if not path.is_file():
        raise ImportError(
            f"CEC-2005 data file {name!r} is missing from {path.parent}; reinstall "
            f"the data with `{INSTALL_HINT}`."
        )
    array = np.loadtxt(path, dtype=np.float64, ndmin=2)
    array.flags.writeable = False
    return array


def _optproblems_matrix_2d(number: int) -> tuple[np.ndarray, str]:
    module_name, class_name, attribute = _OPTPROBLEMS_2D[number]
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ImportError(
            f"CEC-2005 F{number} in dim=2 needs the official 2-D rotation "
            "matrices, which opfunu-core does not ship; they are read from the "
            f"`optproblems` package, which is not installed. Install the optional "
            f"extra: `{INSTALL_HINT}` (or use dim in {SUPPORTED_DIMS[1:]})."
        ) from err
    matrix = np.array(getattr(getattr(module, class_name), attribute), dtype=np.float64)
    return matrix, f"optproblems:{module_name}.{class_name}.{attribute}"


def _readonly(array: np.ndarray) -> np.ndarray:
    array = np.array(array, dtype=np.float64, copy=True)
    array.flags.writeable = False
    return array


def _load_matrix(number: int, dim: int) -> tuple[np.ndarray | None, str | None]:
    if number == 15:
        # Report: "M_i are all identity matrices" for the (unrotated) F15.
        return np.broadcast_to(np.eye(dim), (10, dim, dim)).copy(), "identity"
    prefix = _MATRIX_PREFIX.get(number)
    if prefix is None:
        return None, None
    if dim == 2:
        matrix, source = _optproblems_matrix_2d(number)
    else:
        name = f"{prefix}_M_D{dim}.txt"
        matrix, source = np.array(_load_txt(name)), name
    if number in _COMPOSITION:
        # ASCII layout: rows 1..D are M_1, rows D+1..2D are M_2, ..., 10 blocks.
        matrix = matrix.reshape(10, dim, dim)
    else:
        matrix = matrix.reshape(dim, dim)
    return matrix, source


@cache
def load_cec2005_data(number: int, dim: int) -> CEC2005Data:
    r"""Load (and cache) the official data of CEC-2005 ``F{number}`` in ``dim``-D.

    Args:
        number: Function number, ``1 <= number <= 20``.
        dim: Input dimension, one of ``SUPPORTED_DIMS``.

    Returns:
        The :class:`CEC2005Data` with the report's modifications applied.

    Raises:
        ValueError: If ``number`` or ``dim`` is not supported.
        ImportError: If the optional data packages (``botorch-fed[cec]``) are missing.
    """
    if number not in _SHIFT_FILES:
        raise ValueError(f"CEC-2005 function number must be in 1..20; got {number}.")
    validate_dim(number, dim)
    dim = int(dim)
    shift_file = _SHIFT_FILES[number]
    raw = np.array(_load_txt(shift_file))
    sources = [shift_file]
    extra: dict[str, np.ndarray] = {}

    if number == 5:
        # Line 1: o (1 x 100); lines 2..101: A (100 x 100); use o(1:D), A(1:D, 1:D).
        shift = raw[0, :dim].copy()
        # global_optima.txt: o(1:ceil(D/4)) = -100; o(max(floor(0.75 D), 1):D) = 100
        # (1-based, in this order: for D = 2 the second assignment wins).
        shift[: math.ceil(dim / 4)] = -100.0
        shift[max(math.floor(0.75 * dim), 1) - 1 :] = 100.0
        extra["A"] = _readonly(raw[1 : 1 + dim, :dim])
        optimum = shift
    elif number == 12:
        # Lines 1..100: a; lines 101..200: b; line 201: alpha.
        extra["a"] = _readonly(raw[0:100][:dim, :dim])
        extra["b"] = _readonly(raw[100:200][:dim, :dim])
        extra["alpha"] = _readonly(raw[200, :dim])
        shift = raw[200, :dim].copy()  # the optimum; F12 has no shift vector
        optimum = shift
    elif number in _COMPOSITION:
        shift = raw[:10, :dim].copy()
        if number >= 18:
            # Report (F18-F20): "o_10 = [0, 0, ..., 0]" -- the file's 10th row is
            # replaced by the origin.
            shift[9] = 0.0
        if number == 20:
            # global_optima.txt: o(1, 2*[1:floor(D/2)]) = 5 (1-based even entries).
            shift[0, 1 : 2 * (dim // 2) : 2] = 5.0
        optimum = shift[0]
    else:
        shift = raw[0, :dim].copy()
        if number == 8:
            # global_optima.txt: o(2*[1:floor(D/2)] - 1) = -32 (1-based odd entries);
            # the other entries stay as in the file (deterministic).
            shift[0 : 2 * (dim // 2) : 2] = -32.0
        optimum = shift

    matrix, matrix_source = _load_matrix(number, dim)
    if matrix_source is not None:
        sources.append(matrix_source)
    return CEC2005Data(
        number=number,
        dim=dim,
        shift=_readonly(shift),
        matrix=None if matrix is None else _readonly(matrix),
        optimum=_readonly(optimum),
        extra=extra,
        sources=tuple(sources),
    )
