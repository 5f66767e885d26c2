"""Rollout correction: truncated importance-sampling weights π_old/π_rollout (chapter §2–§3; verl
`rollout_corr_helper.py`).

The PPO ratio π_θ/π_old only limits how far the actor moves from its anchor; it does not correct for
the tokens having been sampled by the rollout engine's π_rollout (chapter §3). With
``algorithm.rollout_correction.rollout_is`` set, the trainer computes these weights once per step
(decoupled mode) and the policy loss multiplies them into the per-token loss *after* clipping;
entropy and the reference KL are not reweighted. With ``rollout_rs`` set, :func:`rollout_rejection_mask`
also drops tokens or whole rows whose rollout/old divergence leaves a hard trust region, by zeroing them
in ``response_mask`` at the same stage.
"""
from __future__ import annotations

import math

import torch

from ppolab.algos.masked import masked_mean, masked_sum
from ppolab.vocab import ROLLOUT_IS_LEVELS, ROLLOUT_RS_OPTIONS  # noqa: F401 (re-exported)

#: Log-ratio clamp before exp, as for the PPO ratio.
IS_LOG_RATIO_CLAMP = 20.0


class _Spec:
    """A setting verl's parser refuses, in verl's words (``str(error)``), keeping the ``template`` and its ``fields``
    so a config check can say it in the learner's language (``ppolab.config.validation``)."""

    def __init__(self, template: str, **fields: object):
        super().__init__(template.format(**fields))
        self.template, self.fields = template, fields


class SpecError(_Spec, ValueError):
    """A threshold or option verl refuses with a ValueError."""


class SpecTypeError(_Spec, TypeError):
    """A threshold of a type verl refuses with a TypeError."""


def parse_is_threshold(spec: float | str) -> tuple[float, float | None]:
    """``rollout_is_threshold`` → (upper, lower): a number or ``"2.0"`` is TIS (lower None), ``"lo_hi"`` IcePop.

    Raises as verl `rollout_corr_helper.py::_parse_rollout_is_threshold`: TypeError for a bool or another type,
    ValueError for an empty or non-numeric string, a non-positive bound or lower > upper.
    """
    if isinstance(spec, bool):
        raise SpecTypeError("rollout_is_threshold must be specified as a float or a string threshold specification, "
                            "not a boolean.")
    if isinstance(spec, (int, float)):
        upper, lower = float(spec), None
    elif isinstance(spec, str):
        text = spec.strip()
        if not text:
            raise SpecError("rollout_is_threshold must not be an empty string.")
        try:
            if "_" in text:
                lo, hi = text.split("_", 1)
                lower, upper = float(lo), float(hi)
            else:
                upper, lower = float(text), None
        except ValueError as exc:
            raise SpecError("Invalid rollout_is_threshold '{spec}'.", spec=spec) from exc
    else:
        raise SpecTypeError("rollout_is_threshold must be a float or a string threshold specification.")
    if upper <= 0:
        raise SpecError("rollout_is_threshold upper bound must be positive, got {upper}.", upper=upper)
    if lower is not None and lower <= 0:
        raise SpecError("rollout_is_threshold lower bound must be positive, got {lower}.", lower=lower)
    if lower is not None and lower > upper:
        raise SpecError("rollout_is_threshold lower bound must be <= upper bound.")
    return upper, lower


def raw_is_weights(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, response_mask: torch.Tensor,
                   level: str = "token") -> tuple[torch.Tensor, torch.Tensor]:
    """Untruncated IS weights × mask, (bs, T), and the log-ratio they came from: per token (bs, T), or the
    sequence sums (bs, 1). token: exp(clamp(lr_t, ±20)); sequence: exp(clamp(Σ_t lr·m, ±20)) on every token."""
    if level not in ROLLOUT_IS_LEVELS:
        raise ValueError(f"rollout_is={level!r} is not valid; choose one of {', '.join(ROLLOUT_IS_LEVELS)}")
    log_ratio = old_log_probs - rollout_log_probs
    if level == "token":
        raw = torch.exp(torch.clamp(log_ratio, -IS_LOG_RATIO_CLAMP, IS_LOG_RATIO_CLAMP))
    else:
        log_ratio = masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1)
        raw = torch.exp(torch.clamp(log_ratio, -IS_LOG_RATIO_CLAMP, IS_LOG_RATIO_CLAMP)).expand_as(response_mask)
    return raw * response_mask, log_ratio


def truncate_is_weights(raw: torch.Tensor, upper: float, lower: float | None = None) -> torch.Tensor:
    """TIS (``lower`` None): min(w, upper); IcePop: w where lower ≤ w ≤ upper, else 0."""
    if lower is None:
        return torch.clamp(raw, max=upper)
    return torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))


@torch.no_grad()
def rollout_is_weights(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    level: str = "token",
    threshold: float | str = 2.0,
) -> torch.Tensor:
    """Truncated IS weights w ≈ π_old/π_rollout, detached, × mask (verl `rollout_corr_helper.py`).

    log_ratio = old − rollout;
    token:    w_t = exp(clamp(log_ratio_t, ±20))
    sequence: w_i = exp(clamp(Σ_t log_ratio·m, ±20)), broadcast over the row.
    Then TIS: w = min(w, threshold); or IcePop (``"lo_hi"``): w = 0 outside [lo, hi].
    Shapes: (bs, T) → (bs, T).
    """
    upper, lower = parse_is_threshold(threshold)
    return truncate_is_weights(raw_is_weights(old_log_probs, rollout_log_probs, response_mask, level)[0], upper, lower)


@torch.no_grad()
def rollout_probs_diff(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor,
                       response_mask: torch.Tensor) -> dict[str, float]:
    """``training/rollout_probs_diff_{max,mean,std}``: |π_old − π_rollout| in probability space over the valid
    tokens (chapter §2: how far the engine's policy is from the trainer's recomputation). Shapes (bs, T)."""
    diff = (old_log_probs.exp() - rollout_log_probs.exp()).abs()[response_mask.bool()]
    if diff.numel() == 0:
        return {}
    return {"training/rollout_probs_diff_max": float(diff.max()),
            "training/rollout_probs_diff_mean": float(diff.mean()),
            "training/rollout_probs_diff_std": float(diff.std()) if diff.numel() > 1 else 0.0}


# ====================================================================== rejection sampling (rollout_rs)
def parse_rollout_rs(rollout_rs: str,
                     rollout_rs_threshold: float | str | None) -> dict[str, tuple[float | None, float]]:
    """``rollout_rs`` (comma list) and ``rollout_rs_threshold`` → {option: (lower, upper)} in ratio space, in order.

    One threshold entry is shared by every option, or there is one entry per option (comma separated). A ``*k1``
    option takes ``"lower_upper"`` ratio bounds, or a single number u meaning lower = 1/u; every other option a
    single positive upper bound (its lower is None). Duplicated options count once. Raises ``ValueError`` with
    verl's wording for anything else (verl `rollout_corr_helper.py::_parse_rollout_rs_thresholds`).
    """
    if rollout_rs is None or not isinstance(rollout_rs, str):
        raise SpecError("rollout_rs must be a non-empty string (comma separated for multiple options).")
    if rollout_rs_threshold is None:
        raise SpecError("rollout_rs_threshold must be provided for rejection sampling.")
    options = list(dict.fromkeys(o.strip() for o in rollout_rs.split(",") if o.strip()))
    if not options:
        raise SpecError("rollout_rs must contain at least one valid option.")
    for option in options:
        if option not in ROLLOUT_RS_OPTIONS:
            raise SpecError("Invalid rollout_rs option: {option}. Must be one of {options}.", option=option,
                            options=sorted(ROLLOUT_RS_OPTIONS))
    if isinstance(rollout_rs_threshold, bool):
        raise SpecTypeError("rollout_rs_threshold must be a string or numeric value specifying per-option "
                            "thresholds.")
    if isinstance(rollout_rs_threshold, (int, float)):
        specs = [str(rollout_rs_threshold)]
    elif isinstance(rollout_rs_threshold, str):
        specs = [s.strip() for s in rollout_rs_threshold.split(",") if s.strip()]
    else:
        raise SpecTypeError("rollout_rs_threshold must be a string or numeric value specifying per-option "
                            "thresholds.")
    if not specs:
        raise SpecError("rollout_rs_threshold must contain at least one threshold value.")
    if len(specs) not in (1, len(options)):
        raise SpecError("rollout_rs_threshold expects either one threshold shared by all options or exactly "
                        "{n} thresholds to match the provided rollout_rs options.", n=len(options))
    specs = specs * len(options) if len(specs) == 1 else specs
    out: dict[str, tuple[float | None, float]] = {}
    for option, spec in zip(options, specs):
        if not option.endswith("k1") and "_" in spec:
            raise SpecError("rollout_rs_threshold for option '{option}' must provide a single upper bound "
                            "without '_'. Received '{spec}'.", option=option, spec=spec)
        lo_text, hi_text = spec.split("_", 1) if "_" in spec else (None, spec)
        try:
            lower, upper = (float(lo_text) if lo_text is not None else None), float(hi_text)
        except ValueError:
            raise SpecError("Invalid numeric threshold '{spec}' for option '{option}'.", spec=spec,
                            option=option) from None
        if option.endswith("k1") and lower is None and upper > 0:
            lower = 1.0 / upper  # a single number u: [1/u, u]
        if upper <= 0 or (lower is not None and lower <= 0):
            raise SpecError("Thresholds for option '{option}' must be positive, got {spec}.", option=option,
                            spec=spec)
        if lower is not None and lower > upper:
            raise SpecError("Thresholds for option '{option}' must be lower <= upper, got {spec}.",
                            option=option, spec=spec)
        out[option] = (lower, upper)
    return out


def _seq_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-row max over valid tokens; 0 for a row without any."""
    top = values.masked_fill(~mask.bool(), float("-inf")).max(dim=-1).values
    return torch.where(torch.isinf(top), torch.zeros_like(top), top)


def _rs_option_metrics(prefix: str, stat: torch.Tensor, seq_stat: torch.Tensor | None, mask: torch.Tensor,
                       seq_valid: torch.Tensor, lower: float, upper: float, has_lower: bool) -> dict[str, float]:
    """verl `rollout_corr_helper.py::compute_rs_metrics` for one option (thresholds in the statistic's space)."""
    valid = mask.bool()
    seq = (seq_stat if seq_stat is not None else masked_mean(stat, mask, axis=-1))[seq_valid]
    sequence_level = seq_stat is not None and seq.numel() > 0
    m = {f"{prefix}_mean": float(masked_mean(stat, mask))}
    if sequence_level:
        m[f"{prefix}_max"], m[f"{prefix}_min"] = float(seq.max()), float(seq.min())
        high = float((seq > upper).float().mean())
        low = float((seq < lower).float().mean()) if has_lower else 0.0
    else:
        m[f"{prefix}_max"] = float(stat.masked_fill(~valid, float("-inf")).max())
        m[f"{prefix}_min"] = float(stat.masked_fill(~valid, float("inf")).min())
        high = float(masked_mean((stat > upper).float(), mask))
        low = float(masked_mean((stat < lower).float(), mask)) if has_lower else 0.0
    m[f"{prefix}_fraction_high"], m[f"{prefix}_fraction_low"] = high, low
    if mask.sum() > 1:
        clamped = stat.clamp(min=lower if has_lower else 0.0, max=upper)
        var = masked_mean(clamped.square(), mask) - masked_mean(clamped, mask).square()
        m[f"{prefix}_std"] = float(torch.sqrt(torch.clamp(var, min=0.0)))
    else:
        m[f"{prefix}_std"] = 0.0
    if seq.numel():
        m.update({f"{prefix}_seq_mean": float(seq.mean()),
                  f"{prefix}_seq_std": float(seq.std()) if seq.numel() > 1 else 0.0,
                  f"{prefix}_seq_max": float(seq.max()), f"{prefix}_seq_min": float(seq.min()),
                  f"{prefix}_seq_max_deviation": float(seq.abs().max()),
                  f"{prefix}_seq_fraction_high": float((seq > upper).float().mean())})
        if has_lower:
            m[f"{prefix}_seq_fraction_low"] = float((seq < lower).float().mean())
    else:
        m.update({f"{prefix}_{k}": 0.0 for k in ("seq_mean", "seq_std", "seq_max", "seq_min", "seq_max_deviation",
                                                 "seq_fraction_high", "seq_fraction_low")})
    return m


@torch.no_grad()
def rollout_rejection_mask(
    old_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_rs: str,
    rollout_rs_threshold: float | str | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Rejection sampling (``algorithm.rollout_correction.rollout_rs``): a hard trust region between the rollout
    engine and the trainer (chapter §2–§3, §9; verl `rollout_corr_helper.py::compute_rollout_rejection_mask`).

    Shapes: all (bs, T) → (new response_mask (bs, T), metrics). With lr = clamp(old − rollout, ±20) per token:

        k1 = −lr = log π_rollout/π_old,   k2 = ½·lr²,   k3 = e^{lr} − 1 − lr

    ``token_kX`` tests each token; ``seq_sum_kX`` / ``seq_mean_kX`` / ``seq_max_kX`` the masked sum / mean / max
    over a sequence's valid tokens and keep or drop the whole row. ``*_k1`` keeps log(lower) ≤ stat ≤ log(upper)
    (ratio bounds compared in log space; ``"0.9_1.1"``, or ``1.1`` for [1/1.1, 1.1]); every other option keeps
    stat ≤ upper. Comma-separated options must all pass (logical AND). A failing token or row is zeroed in the
    returned response_mask, which the advantage, the losses and their metrics then use; the engine keeps
    counting ``loss_mask`` (a copy made at rollout, never rewritten), so token-mean denominators still include
    rejected tokens — verl V1 does the same. Metrics, all ``rollout_corr/``: per option
    ``rollout_rs_<option>_{mean,max,min,fraction_high,fraction_low,std,seq_*,masked_fraction,seq_masked_fraction}``
    and overall ``rollout_rs_masked_fraction`` (rejected share of valid tokens) and
    ``rollout_rs_seq_masked_fraction`` (rows with any rejected token, over all rows). Raises ``ValueError`` if
    ``response_mask`` has no valid token or the options / thresholds are invalid.
    """
    if rollout_rs is None or not isinstance(rollout_rs, str):
        raise ValueError("rollout_rs must be a non-empty string (comma separated for multiple options).")
    if rollout_rs_threshold is None:
        raise ValueError("rollout_rs_threshold must be provided for rejection sampling.")
    if old_log_probs.shape[0] == 0:
        return response_mask, {}
    specs = parse_rollout_rs(rollout_rs, rollout_rs_threshold)
    if not response_mask.bool().any():
        raise ValueError("response_mask must contain at least one valid token (1).")
    lr = torch.clamp(old_log_probs - rollout_log_probs, -IS_LOG_RATIO_CLAMP, IS_LOG_RATIO_CLAMP)
    token = {"k1": -lr, "k2": 0.5 * lr.square(), "k3": torch.exp(lr) - 1.0 - lr}
    valid = response_mask.bool()
    seq_valid = response_mask.sum(dim=-1) > 0
    keep_all = torch.ones_like(response_mask, dtype=lr.dtype)
    metrics: dict[str, float] = {}
    for option, (lower, upper) in specs.items():
        level, k = option.rsplit("_", 1)
        is_k1 = k == "k1"
        lo, hi = (math.log(lower), math.log(upper)) if is_k1 else (0.0, upper)
        seq_stat = None
        if level == "token":
            stat = token[k]
            keep = (stat >= lo) & (stat <= hi) if is_k1 else stat <= hi
        else:
            reduce = {"seq_sum": lambda v: masked_sum(v, response_mask, axis=-1),
                      "seq_mean": lambda v: masked_mean(v, response_mask, axis=-1),
                      "seq_max": lambda v: _seq_max(v, response_mask)}[level]
            seq_stat = reduce(token[k])
            row_keep = (seq_stat >= lo) & (seq_stat <= hi) if is_k1 else seq_stat <= hi
            keep = row_keep.unsqueeze(-1).expand_as(valid)
            stat = seq_stat.unsqueeze(-1).expand_as(lr)
        prefix = f"rollout_corr/rollout_rs_{option}"
        metrics.update(_rs_option_metrics(prefix, stat, seq_stat, response_mask, seq_valid, lo, hi, is_k1))
        keep_f = keep.to(lr.dtype)
        keep_all = keep_all * keep_f
        seq_kept = (~(~keep & valid)).all(dim=-1)
        n_seq = seq_valid.float().sum()
        metrics[f"{prefix}_masked_fraction"] = float(masked_mean(1 - keep_f, response_mask))
        metrics[f"{prefix}_seq_masked_fraction"] = (
            float(((~seq_kept).float() * seq_valid.float()).sum() / n_seq) if n_seq > 0 else 0.0)
    metrics["rollout_corr/rollout_rs_masked_fraction"] = float(masked_mean(1 - keep_all, response_mask))
    rejected_rows = (~((keep_all > 0.5) & valid) & valid).any(dim=-1)
    metrics["rollout_corr/rollout_rs_seq_masked_fraction"] = float(rejected_rows.float().mean())
    return (response_mask * keep_all).to(response_mask.dtype), metrics
