r"""Batched experiment grids: many seeds x clients of a federated BO experiment as one
tensor program on CPU or GPU (:func:`~botorch_fed.experiments.grid.run_grid`), built from
batched BoTorch models and searches (:mod:`~botorch_fed.experiments.batched_gp`)."""

from __future__ import annotations

from botorch_fed.experiments.grid import GRID_ALGORITHMS, GridResult, run_grid

__all__ = ["GRID_ALGORITHMS", "GridResult", "run_grid"]
