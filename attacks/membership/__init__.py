"""Membership inference: was this record (or client) in the training set?

LiRA (Carlini et al. 2022), Shokri et al. 2017's shadow-model attack, threshold attacks (Yeom et al.
2018 and others), RMIA (Zarifzadeh et al. 2024) and canary queries (Wen et al. 2023).

Extension interface: subclass :class:`attacks.base.MembershipAttack`, implement
``run(experiment)`` returning one :class:`~attacks.attack_result.AttackResult` per variant (score every
record of ``experiment``, then ``self.result(...)``), and register it with
``@ATTACKS.register("name")``; the pipeline trains the reference runs the experiment needs.
"""
