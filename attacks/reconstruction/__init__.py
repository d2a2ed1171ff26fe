"""Reconstruction: recover the private inputs from an upload or from the model.

Gradient inversion — DLG (Zhu et al. 2019), iDLG's label recovery (Zhao et al. 2020), Inverting
Gradients (Geiping et al. 2020) — against what the server saw, and model inversion with a learned
inverse network (Fredrikson et al. 2015).

Extension interface: subclass :class:`attacks.base.RunAttack`, implement ``evaluate(run)`` on a
:class:`~attacks.target_run.TargetRun` (its uploads and global models), and report image quality with
:mod:`~attacks.reconstruction.image_quality`; a new matching loss plugs into
:mod:`~attacks.reconstruction.gradient_matching`.
"""
