"""The ``audit-training`` command: a user's ``train(features, labels, seed)`` function, named as
``SCRIPT.py:FUNCTION`` (or ``module:function``), audited on a registered dataset against the
record-level claim its owner states (:func:`audit.own_training.audit_training`).

Heavy imports (torch, the attacks, the user's script) happen inside the command (see
``audit.commands``).
"""

from __future__ import annotations

import argparse

from audit.commands import EXIT_OK


def command_audit_training(args: argparse.Namespace) -> int:
    from audit.core.devices import check_device
    from audit.core.errors import UserInputError
    from audit.core.extensions import is_reference, resolve
    from audit.core.vocabulary import Observer, Relation, Unit
    from audit.external import stated_claim
    from audit.own_training import audit_training, dataset_pool
    from reports.verdict_text import verdict_lines

    if not is_reference(args.train):
        raise UserInputError(f"train: '{args.train}' is not of the form 'SCRIPT.py:FUNCTION' or 'module:function'")
    # every argument checked before the user's code is loaded and anything is trained or written
    check_device(args.device, "--device")
    claim = stated_claim(args.claim_epsilon, args.delta, Unit.RECORD, Relation.ADD_REMOVE, Observer.RELEASED,
                         accountant=args.accountant or "stated by the system's owner")
    _, pool, test = dataset_pool(args.dataset, args.pool, args.seed, args.data_root)
    train = resolve(args.train, "train")
    results = audit_training(train, pool.features, pool.labels, claim, models=args.models, canaries=args.canaries,
                             test=(test.features, test.labels), seed=args.seed, out=args.out, progress=not args.quiet,
                             device=args.device, name=args.train, dataset=args.dataset)
    experiment = results.experiments[0]
    print(f"claimed ε = {args.claim_epsilon:g} (δ = {args.delta:g}, per record, add/remove; {claim.accountant})")
    accuracy = experiment.utility.test_accuracy.value
    if accuracy is not None:
        print(f"test accuracy: {accuracy:.3f} (mean of {args.models} models)")
    for record in experiment.attacks:
        bounds = ", ".join(f"{metric} {record.metrics[metric].value:.3f}" for metric in ("epsilon_one_run", "epsilon_one_run_fdp")
                           if metric in record.metrics and record.metrics[metric].value is not None)
        print(f"  {record.attack:<16} AUC {record.metrics['auc'].value:.3f}" + (f", {bounds}" if bounds else ""))
    print("\n".join(verdict_lines(experiment)))
    print(f"results: {args.out}/results.json, report: {args.out}/report.html")
    return EXIT_OK
