r"""A run's description below the command line and the Flower apps: its parser, ``--config``
file, black box, the checks before it starts (:mod:`.prepare`) and its output files."""
