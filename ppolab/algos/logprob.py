"""Per-token log-probabilities and entropy from logits (verl `torch_functional.py`, `prepare_model_outputs`; chapter §3,
§6).

The trainer divides logits by the rollout temperature (clamped at 1e-8) *before* calling either
function, so the ratio, the reference KL and the entropy all see the temperature-scaled policy.
"""
from __future__ import annotations

import torch

#: Lower clamp on the temperature before it divides the logits (verl's FSDP engine).
MIN_TEMPERATURE = 1e-8


def scale_logits(logits: torch.Tensor, temperature: float | torch.Tensor) -> torch.Tensor:
    """logits / max(temperature, 1e-8) — not in place, so the caller's logits stay intact (chapter §6).

    ``temperature`` is a float or a (bs,) tensor (one temperature per sample), broadcast over (bs, T, V).
    """
    t = torch.as_tensor(temperature, dtype=logits.dtype, device=logits.device).clamp(min=MIN_TEMPERATURE)
    if t.dim() == 1:
        t = t.view(-1, *([1] * (logits.dim() - 1)))
    return logits / t


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log π(label | context) for every position: gather(logits, label) − logsumexp(logits).

    Shapes: logits (..., V), labels (...) integer ids → (...). For fp32/fp64 this is the row-by-row
    gather − logsumexp of verl's ``logprobs_from_logits_v2``; for half precision a log_softmax + gather
    (the numerically safer path verl takes for bf16).
    """
    if logits.dtype in (torch.float32, torch.float64):
        picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)
        return picked - torch.logsumexp(logits, dim=-1)
    return torch.gather(torch.log_softmax(logits, dim=-1), -1, labels.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """H = logsumexp(z) − Σ softmax(z)·z over the vocabulary (chapter §6: H = −Σ_a π log π).

    Shapes: (..., V) → (...). No dtype cast, as verl.
    """
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)


def calculate_sum_pi_squared_from_logits(logits: torch.Tensor,
                                         temperature: float | torch.Tensor | None = None) -> torch.Tensor:
    """Σ_v π(v)² per position, the "collision probability" the optimal-token-baseline estimators need (chapter
    §6; verl `torch_functional.py::calculate_sum_pi_squared_from_logits`).

        Σ_v π(v)² = exp(logsumexp(2z) − 2·logsumexp(z))

    exact and overflow-free. Shapes: (..., V) → (...). verl computes it on the temperature-scaled logits of the
    old-log-prob forward (and the trainer then stores it as float32); pass ``temperature`` to scale here, or
    scaled logits with ``temperature=None``. No dtype cast.
    """
    if temperature is not None:
        logits = scale_logits(logits, temperature)
    return torch.exp(torch.logsumexp(2.0 * logits, dim=-1) - 2.0 * torch.logsumexp(logits, dim=-1))
