"""Canary audits: insert canaries at random, measure ε from how well they are told apart.

Record canaries and the one-run audit (Steinke, Nasr, Jagielski 2023), canary clients (Andrew et al.
2024), Dirac canary clients at scale, and gradient canaries for DP-SGD (Nasr et al. 2023).

Extension interface: a canary audit is a :class:`attacks.base.MembershipAttack` whose experiment
carries inserted and held-out canaries; :mod:`~attacks.canaries.canary_audit` turns their scores into
ROC figures and the ε lower bounds, so a new canary design only says how to craft and score them.
"""
