r"""A run's description, below the command line and the Flower apps: the parser of
``run <algorithm>`` (:mod:`~botorch_fed.runs.parser`, options generated from each
algorithm's settings by :mod:`~botorch_fed.runs.options`), the ``--config`` TOML file
(:mod:`~botorch_fed.runs.config`), the black box (:mod:`~botorch_fed.runs.black_box`:
``--problem`` / ``--objective`` / ``--bounds``), setup and settings from the arguments
(:mod:`~botorch_fed.runs.arguments`), the checks before a run starts
(:mod:`~botorch_fed.runs.prepare`) and its output files (:mod:`~botorch_fed.runs.outputs`).
"""
