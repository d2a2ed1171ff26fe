"""The federated engine: the round loop every round-based defense runs on.

Each round samples clients, trains them locally as one batched computation
(:mod:`defenses.blocks.local_training`), lets the defense privatise and aggregate the uploads, and
evaluates the new global model (McMahan et al. 2017; DP-FedAvg, McMahan et al. 2018, Alg. 1).

Extension interface: the engine runs any object that satisfies the
:class:`~defenses.federated.round_defense.RoundDefense` protocol; it never imports a defense's
class. :mod:`~defenses.federated.training_job` holds the types a run is given and returns, and
:mod:`~defenses.federated.release_probe` drives the same code for the conformance audit.
"""
