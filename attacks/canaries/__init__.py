"""Canary audits: insert canaries at random, measure ε from how well they are told apart.

Record canaries and the one-run audit (Steinke, Nasr, Jagielski 2023), canary clients (Andrew et al.
2024), Dirac canary clients at scale, and gradient canaries for DP-SGD (Nasr et al. 2023).

Extension interface: subclass :class:`~attacks.canaries.canary_audit.CanaryAudit` (an
:class:`attacks.base.Attack` that trains runs of its own with canaries inserted and held out) and say
what to insert (``injection``) and how to score a canary on a trained run (``statistics``);
:mod:`~attacks.canaries.canary_audit` turns the scores into ROC figures and the ε lower bounds.
"""
