"""Every DPFL algorithm ("defense"), built from shared blocks.

Import :mod:`defenses.catalog` to register all defenses in ``defenses.base.DEFENSES``; the
package itself imports nothing heavy, so ``dpfl-audit epsilon`` starts without torch.

Adding a defense — the interface, what is optional, the adapter the audits use
(:mod:`defenses.audit_hooks`) and the claim — is explained in one place, with a runnable example:
docs/how-to/add-a-defense.md.
"""
