"""Attacks on trained runs and on what the server saw.

Import :mod:`attacks.catalog` to register all attacks in ``attacks.base.ATTACKS``.
"""
