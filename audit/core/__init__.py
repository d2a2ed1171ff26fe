"""The foundation every layer stands on: nothing here imports from the rest of the project.

Errors (:mod:`~audit.core.errors`), keyed random streams (:mod:`~audit.core.seeding`),
registries and the code-loading names they accept (:mod:`~audit.core.registry`,
:mod:`~audit.core.extensions`), config validation (:mod:`~audit.core.schema`,
:mod:`~audit.core.strict_yaml`), files (:mod:`~audit.core.atomic`, :mod:`~audit.core.safe_names`),
the shared data types — datasets (the registry :mod:`~audit.core.datasets`, the type
:mod:`~audit.core.dataset_types` and one loader module per source) and models
(:mod:`~audit.core.models`) — and the statistics both attacks and reports need
(:mod:`~audit.core.metrics`, :mod:`~audit.core.empirical_epsilon`,
:mod:`~audit.core.fdp_one_run`, :mod:`~audit.core.audit_power`).

Layers, lowest first: ``audit.core`` → ``defenses`` → ``attacks`` → ``reports`` → the rest of
``audit`` (plan, train, attack, store, executors, CLI, reproduce). The import contract in
``pyproject.toml`` (``lint-imports``) and ``tests/test_layers.py`` keep every arrow pointing down.
"""
