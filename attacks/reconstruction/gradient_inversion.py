"""Gradient inversion against a trained run: ``gradient-inversion`` in an audit config.

The honest-but-curious server knows the global model it sends out. This attack replays what
it would observe from a client of the audited run — at the run's own global model of the
chosen round, with the defense's own clip and noise — and reconstructs the client's records
with DLG, iDLG or Inverting Gradients (:mod:`attacks.reconstruction.inversion`):

* the attacked client holds ``batch_size`` records of a real client of the run (run 0) and
  uploads its gradient (``threat: gradient``) or its FedAvg update after ``local_steps`` local
  SGD steps at the run's client learning rate (``threat: update``; the attacker simulates the
  same steps on its dummy data);
* the upload is privatised as the defense does it (:mod:`attacks.server_view`): clipped (flat,
  or every parameter tensor separately with ``clip_mode: per_tensor``) and noised for
  DP-FedAvg — a single upload, or under secure aggregation the sum of the round's
  uploads, which the attack must untangle into m·``batch_size`` records; defenses whose
  privatisation is not replayed are listed as not run, with the reason.

Metrics per image (MSE, PSNR, SSIM with the data's range; label accuracy) are averaged with a
Student-t interval over the attacked images; the grid (truth above, reconstruction below) goes
into the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

import numpy as np

from attacks.attack_result import AttackResult
from attacks.base import ATTACKS, RunAttack, Setting
from attacks.reconstruction.image_quality import image_grid_png, png_base64
from attacks.reconstruction.inversion import REFERENCES, attack_batch, data_range_of
from attacks.server_view import not_replayed_reason, upload_view
from attacks.target_run import TargetRun
from attacks.threat_models import ThreatModel
from audit.core.errors import UserInputError
from audit.core.lazy_modules import lazy_module
from audit.core.metrics import mean_estimate
from audit.core.seeding import derive_seed, numpy_rng
from audit.core.vocabulary import AttackKind, Unit

if TYPE_CHECKING:
    import torch
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")


@dataclass(frozen=True)
class ReconstructionParams:
    attack: Literal["inverting-gradients", "dlg", "idlg"] = field(
        default="inverting-gradients", metadata={"help": "reconstruction attack"})
    threat: Literal["gradient", "update"] = field(
        default="update", metadata={"help": "the client uploads one batch gradient, or its update after local steps"})
    batch_size: int = field(default=4, metadata={"min": 1, "help": "records of the attacked client (batch size 1, 4, 8 …)"})
    local_steps: int = field(default=3, metadata={"min": 1, "help": "local SGD steps of the update threat model"})
    round: int = field(default=1, metadata={"min": 1, "help": "round whose global model the server sends (1: the initial model)"})
    clients: int = field(default=1, metadata={"min": 1, "help": "clients attacked, one after another"})
    iterations: int = field(default=500,
                            metadata={"min": 1, "help": "attack iterations (`dpfl-audit invert` defaults to the attack's own)"})
    restarts: int = field(default=1, metadata={"min": 1, "help": "random restarts, the best match kept"})
    max_images: int = field(default=32, metadata={"min": 1, "help": "skip when a secure sum hides more records than this"})


@ATTACKS.register
class GradientInversion(RunAttack):
    name = "gradient-inversion"
    summary = "reconstruct a client's records from its upload (DLG, iDLG, Inverting Gradients) at the run's model"
    reference = "Zhu et al. 2019; Zhao et al. 2020; Geiping et al. 2020"
    Params = ReconstructionParams

    def not_applicable(self, defense, dataset) -> str | None:
        if len(dataset.input_shape) != 3:
            return f"'{dataset.name}' is not an image dataset"
        return not_replayed_reason(defense)

    def check(self, field_path: str, setting: Setting) -> None:
        # the model the server sends in round r exists for r ≤ rounds; a later round would be
        # found missing only after training
        if self.params.round > setting.rounds:
            raise UserInputError(f"{field_path}.params.round: round {self.params.round} of a training of {setting.rounds} "
                                 f"rounds; allowed: 1 to {setting.rounds}")
        if self.params.clients > setting.clients:
            raise UserInputError(f"{field_path}.params.clients: {self.params.clients} clients attacked of the "
                                 f"{setting.clients} in a run; allowed: 1 to {setting.clients} (partition.clients)")

    def rounds_needed(self, total_rounds: int) -> str | tuple[int, ...]:
        before = self.params.round - 1  # the global model the clients of this round start from
        return (before,) if 1 <= before < total_rounds else "none"

    def threat(self, run: TargetRun) -> ThreatModel:
        view = upload_view(run.defense, run.training, len(run.clients))
        return ThreatModel(self.params.threat, batch_size=self.params.batch_size, clients=view.clients,
                           local_steps=self.params.local_steps, local_batch=min(self.params.batch_size, run.training.batch_size),
                           lr=run.training.lr, clip=view.clip, noise=view.noise, clip_mode=view.clip_mode)

    def evaluate(self, run: TargetRun) -> list[AttackResult]:
        threat = self.threat(run)
        if threat.examples > self.params.max_images:
            notes = (f"not attempted: the server sees a secure sum of {threat.clients} uploads "
                     f"({threat.examples} records > max_images {self.params.max_images})")
            return [AttackResult(self.label, "", Unit.CLIENT, np.zeros((0, 0)), np.zeros((0, 0), dtype=bool), {}, ((), ()),
                                 notes, kind=AttackKind.RUN)]
        eligible = [c for c in range(len(run.clients)) if len(run.clients[c]) >= self.params.batch_size]
        if len(eligible) < threat.clients:  # e.g. a zero-out membership run whose coins emptied the clients
            notes = (f"not attempted: {len(eligible)} of the target run's {len(run.clients)} clients hold "
                     f"{self.params.batch_size} records, and an upload of this threat model needs {threat.clients}")
            return [AttackResult(self.label, "", Unit.CLIENT, np.zeros((0, 0)), np.zeros((0, 0), dtype=bool), {}, ((), ()),
                                 notes, kind=AttackKind.RUN)]
        params = run.global_before(self.params.round)
        if params is None:
            raise RuntimeError(f"gradient-inversion: the global model before round {self.params.round} was not stored")
        params = {k: v.detach() for k, v in params.items()}
        data_range = data_range_of(run.pool_x)
        rng = numpy_rng(run.seed, "gradient-inversion", self.label)
        truth, reconstructions = [], []
        per_image: dict[str, list[float]] = {"ssim": [], "psnr": [], "mse": []}
        correct = []
        run.model.eval()
        for attempt in range(self.params.clients):
            chosen = rng.choice(eligible, size=threat.clients, replace=False)
            records = np.concatenate([rng.choice(run.clients[c], self.params.batch_size, replace=False) for c in chosen])
            index = torch.as_tensor(records)
            x, y = run.pool_x[index].to(run.device), run.pool_y[index].to(run.device)
            outcome = attack_batch(self.params.attack, run.model, params, x, y, threat, self.params.iterations,
                                   self.params.restarts, seed=derive_seed(run.seed, "gradient-inversion", self.label, attempt),
                                   data_range=data_range)
            truth.append(x.cpu())
            reconstructions.append(outcome["images"].cpu())
            for key in per_image:
                per_image[key].extend(float(v) for v in outcome[key])
            correct.extend((outcome["labels"].cpu() == y.cpu()).double().tolist())
        metrics = {name: mean_estimate(values) for name, values in per_image.items()}
        metrics["label_accuracy"] = mean_estimate(correct)
        iterations = self.params.iterations
        notes = (f"{self.params.attack} ({REFERENCES[self.params.attack]}), {iterations} iterations × {self.params.restarts} "
                 f"restart(s); server view: {threat.describe()}, at the global model before round {self.params.round}; "
                 f"{len(correct)} records of run 0's clients; means with 95 % t-intervals over images")
        grid = image_grid_png(torch.cat(truth)[:16], torch.cat(reconstructions)[:16], data_range)
        figure = {"title": f"{self.label}: {run.key}",
                  "png": png_base64(grid),
                  "caption": f"Private records (top) and their reconstructions (bottom); {threat.describe()}."}
        return [AttackResult(self.label, "", Unit.RECORD, np.zeros((0, 0)), np.zeros((0, 0), dtype=bool), metrics, ((), ()),
                             notes, figures=[figure], kind=AttackKind.RUN)]
