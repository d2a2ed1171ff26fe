"""Audits of the mechanism itself rather than of a trained model.

:mod:`~attacks.mechanism_audits.conformance` checks, observer by observer and round by round, that a
defense's own code releases the noise its claim accounts for (its per-observer checks in
:mod:`~attacks.mechanism_audits.conformance_checks`, their statistics in
:mod:`~attacks.mechanism_audits.conformance_statistics`); :mod:`~attacks.mechanism_audits.mechanism_audit`
audits one clipped-and-noised step with the optimal test. Neither imports another attack.

Extension interface: an audit takes a defense through :mod:`defenses.federated.release_probe` (its
real code path, obtained from the defense's :meth:`~defenses.audit_hooks.AuditHooks.release_probe`)
and returns a verdict with its statistics and power.
"""
