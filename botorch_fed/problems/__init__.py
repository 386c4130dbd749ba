r"""What a federation optimises: the user's black boxes (:mod:`.objectives`: the
:class:`~botorch_fed.problems.objectives.Objective` contract, ``CallableObjective``) and
the heterogeneity of benchmark federations (:mod:`.heterogeneity`: per-client shifted
objectives, initial-design regions) and black boxes whose values a person reports later
(:mod:`.ask_tell`). The built-in test functions are in
:mod:`botorch_fed.test_functions`, the tasks in :mod:`botorch_fed.tasks`."""
