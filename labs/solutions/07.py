"""Solutions to lab 07's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
import math

import torch

from ppolab import algos
from ppolab.exercises.lab07 import _run_model, step1_entropy
from ppolab.models import load_tokenizer_and_model
from ppolab.numbers.steps import optimizer_step_batch
from ppolab.numbers.temperature import first_step_loss, run_temperature
from ppolab.run.reader import resolve_run
from ppolab.models import forward_response

TEMP_RUN = "grpo_temp_tiny"


def _real_mask(t):
    return t["response_mask"].float() * (~t["is_pad"].bool()).float().unsqueeze(-1)


def ceiling_share(run=None, over="real", reduce="max"):
    """07.1: the largest recorded entropy of step 1 (else the first recorded step) over log V."""
    r = resolve_run(run)
    t = r.step(1 if 1 in r.steps else r.steps[0]).tensors
    m = _real_mask(t) > 0 if over == "real" else torch.ones_like(t["entropy"], dtype=torch.bool)
    h = t["entropy"][m]
    top = h.max() if reduce == "max" else h.mean()
    return float(top) / math.log(_run_model(r).config.vocab_size)


def seq_entropy(run, step, pooled=False):
    """The recorded entropy of ``step``: each real response's token mean, then the mean over responses (or, with
    ``pooled``, one token mean over all of them, as actor/entropy is logged)."""
    t = resolve_run(run).step(step).tensors
    m = _real_mask(t)
    if pooled:
        return float((t["entropy"] * m).sum() / m.sum())
    rows = m.sum(-1) > 0
    return float(((t["entropy"] * m).sum(-1)[rows] / m.sum(-1)[rows]).mean())


def recorded_entropy_ratio(run=None, pooled=False):
    r = resolve_run(run)
    return seq_entropy(r, r.steps[-1], pooled) / seq_entropy(r, r.steps[0], pooled)


def entropy_ratio(run=None):
    ent = resolve_run(run).metrics["actor/entropy"].dropna()
    return ent.iloc[-10:].mean() / ent.iloc[:10].mean()


def _first_batch(run):
    """Recorded step 1, optimizer step 0: its rows run through the base model (π_θ there), raw logits kept."""
    r = resolve_run(run or TEMP_RUN)
    rec = r.step(1)
    t = rec.tensors
    b = optimizer_step_batch(rec, 0)
    ids = torch.cat([t["prompts"], t["responses"]], dim=1)[b["rows"]]
    attn = torch.cat([t["prompt_mask"], t["loss_mask"].long()], dim=1)[b["rows"]]
    model = load_tokenizer_and_model(r.model_path())[1]
    return r, b, model, ids, attn, t["responses"].shape[1]


def ratio_without_temperature(run=None, temperature=1.0, mean_over_all=False, share_below=True):
    """The learner's code: π_θ's log-probs from logits divided by ``temperature`` (1.0: not divided at all); the
    share of valid tokens whose ratio is below 1 (``share_below=False``: the mean ratio, which the lab prints)."""
    r, b, model, ids, attn, R = _first_batch(run)
    with torch.no_grad():
        lp = forward_response(model, ids, attn, R, temperature).log_probs
    m = b["response_mask"]
    ratio = torch.exp(torch.clamp(lp - b["old_log_probs"], -20, 20))
    x = (ratio < 1).float() if share_below else ratio
    if mean_over_all:
        return x.mean().item()
    return algos.masked_mean(x, m).item()


def bonus_shift(run=None, temperature=None, sign=-1.0, mode=None):
    """The learner's code: −entropy_coeff · agg_loss(H, response_mask, loss_agg_mode) at the first optimizer step."""
    r, b, model, ids, attn, R = _first_batch(run)
    T = run_temperature(r) if temperature is None else temperature
    with torch.no_grad():
        H = forward_response(model, ids, attn, R, T, want_log_probs=False, want_entropy=True).entropy
    actor = r.config["actor_rollout_ref"]["actor"]
    agg = algos.agg_loss(H, b["response_mask"], mode or actor["loss_agg_mode"]).item()
    return sign * actor["entropy_coeff"] * agg


SOLUTIONS = {
    "07.1": ceiling_share,
    "07.2": lambda run=None: round(step1_entropy(run, 2.0), 3),
    "07.3": lambda run=None: step1_entropy(run, 0.5),
    "07.4": recorded_entropy_ratio,
    "07.5": ratio_without_temperature,
    "07.6": bonus_shift,
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # the ceiling itself (the old answer, log V); the mean instead of the largest; the ceiling taken in bits (log₂ V)
    "07.1": [lambda run=None: math.log(_run_model(resolve_run(run)).config.vocab_size),
             lambda run=None: ceiling_share(run, reduce="mean"),
             lambda run=None: ceiling_share(run) * math.log(2)],
    "07.2": [lambda run=None: step1_entropy(run, 1.0), lambda run=None: step1_entropy(run, 0.5), math.log(29)],
    # the run's own temperature (1.0) instead of 0.5; T applied as a multiplier (z·0.5 = z / 2.0)
    "07.3": [lambda run=None: step1_entropy(run, 1.0), lambda run=None: step1_entropy(run, 2.0)],
    # first over last; one token mean over the batch (as actor/entropy is logged); the old answer from the log's
    # last 10 and first 10 steps; the logged values' last/first single step
    "07.4": [lambda run=None: 1 / recorded_entropy_ratio(run), lambda run=None: recorded_entropy_ratio(run, True),
             entropy_ratio,
             lambda run=None: resolve_run(run).metrics["actor/entropy"].dropna().iloc[-1]
             / resolve_run(run).metrics["actor/entropy"].dropna().iloc[0]],
    # with the temperature (no token below 1); T applied as a multiplier (z·T = z / (1/T)); the share above 1; a
    # share over every position, padding included; the mean ratio the lab prints
    "07.5": [0.0, lambda run=None: ratio_without_temperature(run, 1 / run_temperature(run or TEMP_RUN)),
             lambda run=None: 1 - ratio_without_temperature(run),
             lambda run=None: ratio_without_temperature(run, mean_over_all=True),
             lambda run=None: ratio_without_temperature(run, share_below=False)],
    # a bonus added, not subtracted; the entropy of the undivided logits (T skipped); token-sum instead of the
    # run's token-mean; as if no entropy were computed (calculate_entropy off, entropy_coeff 0)
    "07.6": [lambda run=None: bonus_shift(run, sign=1.0), lambda run=None: bonus_shift(run, temperature=1.0),
             lambda run=None: bonus_shift(run, mode="token-sum"), 0.0,
             lambda run=None: -first_step_loss(run)[1]["actor/entropy_loss"]],
}
