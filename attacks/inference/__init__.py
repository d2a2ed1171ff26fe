"""Inference of what a record or a client's data has, short of membership.

Attribute inference (a record's sensitive attribute from the model, against a data-only baseline)
and property inference from clients' uploads (Melis et al. 2019).

Extension interface: subclass :class:`attacks.base.RunAttack` and implement ``evaluate(run)``;
report the attack's score beside the baseline an attacker without the model reaches.
"""
