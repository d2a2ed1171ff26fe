"""Every DPFL algorithm ("defense"), built from shared blocks.

Import :mod:`defenses.catalog` to register all defenses in ``defenses.base.DEFENSES``; the
package itself imports nothing heavy, so ``dpfl-audit epsilon`` starts without torch.
"""
