"""What the attribute-inference attacker reads from a record and a model.

The attribute's encoding in the features, read from records with known attribute (one-hot
columns or one standardised column); records with the attribute columns replaced — by a
candidate value's encoding (the black-box queries) or by the auxiliary mean, a "neutralised"
query that hides the true value; the model's log-confidence in a record's true label, log f(x)_y,
for every candidate value (Fredrikson et al. 2014, "Privacy in Pharmacogenetics"; Fredrikson,
Jha, Ristenpart 2015; Yeom et al. 2018); and the model's penultimate-layer embeddings, the input
of its last ``nn.Linear`` (ML-Doctor, Liu et al. 2022, white-box attribute inference).
The guesses built on them are in :mod:`attacks.inference.attribute_inference`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from audit.core.lazy_modules import lazy_module
from defenses.federated.evaluation import logits_of

if TYPE_CHECKING:
    import torch
    from torch import nn
else:  # imported when first used (audit.core.lazy_modules)
    torch = lazy_module("torch")
    nn = lazy_module("torch.nn")


def attribute_encodings(column_values: np.ndarray, codes: np.ndarray, num_values: int) -> np.ndarray:
    """The attribute columns' values for each code, [num_values, columns], read from records with
    known attribute (``column_values`` [records, columns], ``codes`` [records]).

    Every record of one code has the same encoding (a one-hot row, or one standardised number),
    so the mean over the code's records is that encoding. A code absent from the records can
    only be filled in for a one-hot layout (one column per value); otherwise it is an error.
    """
    column_values = np.asarray(column_values, dtype=np.float64)
    codes = np.asarray(codes, dtype=np.int64)
    columns = column_values.shape[1]
    one_hot_layout = columns == num_values and np.isin(column_values, (0.0, 1.0)).all()
    encodings = np.zeros((num_values, columns))
    for code in range(num_values):
        chosen = codes == code
        if chosen.any():
            encodings[code] = column_values[chosen].mean(0)
        elif one_hot_layout:
            encodings[code, code] = 1.0
        else:
            raise ValueError(f"attribute code {code} has no auxiliary record, so its encoding is unknown; "
                             f"pass encodings= explicitly")
    return encodings


def with_attribute_columns(features: torch.Tensor, columns: Sequence[int], values: np.ndarray) -> torch.Tensor:
    """A copy of ``features`` whose attribute columns (indices into the flattened record) hold
    ``values`` — one row for all records [columns], or one per record [records, columns]."""
    flat = features.reshape(len(features), -1).clone()
    index = torch.as_tensor(list(columns), dtype=torch.long, device=flat.device)
    filler = torch.as_tensor(np.asarray(values), dtype=flat.dtype, device=flat.device)
    flat[:, index] = filler.expand(len(flat), len(index)) if filler.ndim == 1 else filler
    return flat.reshape(features.shape)


# --------------------------------------------------------------------------- the model's views


def last_linear(model: nn.Module) -> nn.Linear:
    """The last ``nn.Linear`` registered in ``model`` — the classifier head in every model of
    :mod:`audit.core.models` (``nn.Sequential`` ends with it; torchvision's ResNet registers ``fc``
    last). A model whose head is registered before other layers needs its own hook."""
    linears = [module for module in model.modules() if isinstance(module, nn.Linear)]
    if not linears:
        raise ValueError("white-box attribute inference needs a model with an nn.Linear head")
    return linears[-1]


def penultimate_embeddings(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor,
                           batch_size: int = 4096) -> np.ndarray:
    """The input of the model's last linear layer for each record, float64 [records, width]
    (ML-Doctor's white-box attribute-inference features), via a forward hook in eval mode."""
    captured: list[torch.Tensor] = []
    handle = last_linear(model).register_forward_hook(
        lambda _module, inputs, _output: captured.append(inputs[0].detach().reshape(len(inputs[0]), -1)))
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, len(x), batch_size):
                torch.func.functional_call(model, params, (x[start:start + batch_size],))
    finally:
        handle.remove()
        model.train(was_training)
    if not captured:
        return np.zeros((0, 0))
    return torch.cat(captured).cpu().double().numpy()


def label_log_probabilities(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor,
                            y: torch.Tensor) -> np.ndarray:
    """log f(x)_y per record (float64): the model's log-confidence in each record's true label."""
    logits = logits_of(model, params, x).double()
    return torch.log_softmax(logits, 1).gather(1, y.to(logits.device).view(-1, 1)).squeeze(1).cpu().numpy()


def candidate_log_likelihoods(model: nn.Module, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
                              columns: Sequence[int], encodings: np.ndarray) -> np.ndarray:
    """log f(x_v)_y for every record and candidate value v, [records, values]: the model's
    log-confidence in the true label with the attribute columns set to v's encoding."""
    return np.stack([label_log_probabilities(model, params, with_attribute_columns(x, columns, encoding), y)
                     for encoding in encodings], axis=1)
