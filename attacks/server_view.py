"""What an honest-but-curious server sees of one client upload, defense by defense.

The run attacks that replay uploads (gradient inversion, property inference) need the
defense's privatisation of a single upload. It is replayed exactly for the defenses listed in
:data:`REPLAYED`:

* FedAvg / FedSAM: the upload as it is;
* DP-FedAvg: flat ℓ2 clip to S, Gaussian noise. With client-side noise each upload carries
  noise std S·σ/√m (m the expected participants) and the server sees it alone; with the noise
  on the aggregate, or secure aggregation, the server sees only the sum of the m uploads with
  total noise S·σ — equivalently each upload's share S·σ/√m, summed.

Other defenses privatise differently (sparsification, per-example DP-SGD, LDP perturbation,
votes); replaying them approximately would attack an upload the defense never sends, so the
attacks report themselves as not run there, with this module's reason.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: defense name → how its uploads are privatised
REPLAYED = {"fedavg": "plain", "fedsam": "plain", "dp-fedavg": "gaussian"}


@dataclass(frozen=True)
class UploadView:
    clip: float | None  # ℓ2 clip of each upload (None: not clipped)
    noise: float  # each upload's Gaussian noise std, in units of the clip
    clients: int  # uploads the server sees summed (1: each upload on its own)


def not_replayed_reason(defense) -> str | None:
    if defense.name in REPLAYED:
        return None
    return f"the upload privatisation of '{defense.name}' is not replayed (replayed: {', '.join(REPLAYED)})"


def upload_view(defense, training, num_clients: int) -> UploadView:
    """The privatisation of one upload of ``defense`` in a round with the expected participants."""
    if REPLAYED.get(defense.name) != "gaussian":
        return UploadView(None, 0.0, 1)
    expected = max(1, int(round(training.sampling_rate(num_clients) * num_clients)))
    noise = float(defense.params.noise_multiplier) / math.sqrt(expected)
    return UploadView(float(defense.params.clip), noise, 1 if defense.observes == "uploads" else expected)
