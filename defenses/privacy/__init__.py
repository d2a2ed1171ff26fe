"""What a defense claims and how it is accounted.

:mod:`~defenses.privacy.claims` states a claim: ε and δ, the unit (record or client), the
neighbouring relation (add/remove or replace) and the observer it holds against.
:mod:`~defenses.privacy.accounting` composes (subsampled) Gaussian rounds with dp-accounting's RDP or
PLD accountants (:mod:`~defenses.privacy.pld_grid` sizes the PLD's grids first),
:mod:`~defenses.privacy.subsampled_rdp` subsamples any mechanism's RDP curve, and
:mod:`~defenses.privacy.calibration` finds the least noise that meets a target ε.

Extension interface: a defense returns a claim per observer; a new accountant is a function from a
noise schedule and δ to ε (float64) that names its accountant and RDP→ε conversion.
"""
