"""Attacks on trained runs and on what the server saw.

Import :mod:`attacks.catalog` to register all attacks in ``attacks.base.ATTACKS``. To add one,
see docs/how-to/add-an-attack.md: the interface (:mod:`attacks.base`), what the harness gives an attack,
how its results are reported and validated, and which sub-package it belongs in.
"""
