"""Lab 07 — entropy and temperature (chapter §6)."""
from __future__ import annotations

import functools
import math

import torch

from ppolab import algos
from ppolab.exercises import exercise


def _temperature_case(run=None) -> dict:
    from ppolab.numbers.temperature import temperature_case

    return temperature_case(run)


def _entropy_bonus_case(run=None) -> dict:
    from ppolab.numbers.temperature import entropy_bonus_case

    return entropy_bonus_case(run)


@functools.lru_cache(maxsize=2)
def _model(path: str):
    from ppolab.models import load_tokenizer_and_model

    return load_tokenizer_and_model(path)[1]


def _run_model(run):
    from ppolab.numbers.kl import run_base_model

    return _model(str(run_base_model(run)))


def step1_entropy(run=None, temperature: float = 1.0) -> float:
    """Masked mean entropy of recorded step 1's response tokens under the base model at ``temperature``,
    through the trainer's own forward pass (``ppolab.models.forward_response``)."""
    from ppolab.models import forward_response
    from ppolab.run.reader import resolve_run

    r = resolve_run(run)
    t = r.step(1).tensors
    ids = torch.cat([t["prompts"], t["responses"]], dim=1)
    mask = torch.cat([t["prompt_mask"], t["response_mask"].long()], dim=1)
    with torch.no_grad():
        out = forward_response(_run_model(r), ids, mask, t["responses"].shape[1], temperature,
                               want_log_probs=False, want_entropy=True)
    return algos.masked_mean(out.entropy, t["response_mask"]).item()


@exercise("07.3", "The masked-mean entropy of recorded step 1's response tokens at T = 0.5 (the base model, which is "
          "π_old at step 1).",
          kind="compute",
          hints=("Divide the response logits by T before the softmax, take each position's entropy, then average "
                 "over the response mask.",
                 "masked_mean(entropy_from_logits(scale_logits(response_logits, 0.5)), response_mask)."),
          rel=0.0, abs=2e-5, context=("run",), needs=("step1",))
def _e1(run=None) -> float:
    return step1_entropy(run, 0.5)


def _real_response_mask(t) -> torch.Tensor:
    """response_mask of the real rows (synthetic padding rows zeroed)."""
    m = t["response_mask"].float()
    return m * (~t["is_pad"].bool()).float().unsqueeze(-1) if "is_pad" in t else m


def seq_mean_entropy(run=None, step: int | None = None) -> float:
    """The recorded stage-4 entropy of ``step`` averaged per real response first, then over the responses with at
    least one token (seq-mean-token-mean; the logged actor/entropy is a token mean over the whole batch)."""
    from ppolab.run.reader import resolve_run

    r = resolve_run(run)
    t = r.step(r.steps[0] if step is None else step).tensors
    m = _real_response_mask(t)
    per_row = algos.masked_mean(t["entropy"].float(), m, axis=-1)
    return float(per_row[m.sum(-1) > 0].mean())


def _first_last_case(run=None) -> dict:
    from ppolab.run.reader import resolve_run

    r = resolve_run(run)
    return {"step": r.steps[0], "last": r.steps[-1]}


@exercise("07.4", "Where entropy went during training, from the recorded tensors: the stage-4 entropy (t['entropy'], "
          "π_old at the rollout temperature) averaged over each real response's tokens, then over the responses "
          "(seq-mean-token-mean), at the last recorded step {last} divided by the same at the first recorded step "
          "{step}. (3 decimals)",
          kind="compute",
          hints=("Take each recorded step's entropy tensor and the response_mask of its real rows (is_pad = 0); "
                 "average each row over its own tokens first, then average the rows that have tokens. Then the "
                 "last step over the first.",
                 "per_row = masked_mean(t['entropy'], mask, axis=-1) over rows with mask.sum(-1) > 0, mean; answer "
                 "(that at step {last}) / (that at step {step}). The logged actor/entropy is a token mean: another "
                 "number."),
          rel=0.0, abs=5e-4, context=("run",), needs=("steps",), case=_first_last_case)
def _e2(run=None) -> float:
    c = _first_last_case(run)
    return seq_mean_entropy(run, c["last"]) / seq_mean_entropy(run, c["step"])


def _ceiling_case(run=None) -> dict:
    from ppolab.numbers.cases import recorded_step_case

    return recorded_step_case(run, 1)


@exercise("07.1", "The ceiling, and how close recorded step {step} comes to it: the largest entropy that stage 4 "
          "recorded (t['entropy']) over the real response tokens of that step, as a share of the largest entropy "
          "any single response position can have under this model at any temperature. (3 decimals)",
          kind="compute",
          hints=("Which distribution over a finite vocabulary has the largest entropy, and how many tokens does "
                 "this model's vocabulary hold? Then take the largest recorded entropy over response_mask = 1 of "
                 "the real rows.",
                 "H_max = log V (natural log), V = model.config.vocab_size (the uniform distribution, reached as "
                 "T → ∞); answer t['entropy'][mask > 0].max() / log V."),
          rel=0.0, abs=5e-4, context=("run",), needs=("steps",), case=_ceiling_case)
def _e3(run=None) -> float:
    from ppolab.run.reader import resolve_run

    r = resolve_run(run)
    t = r.step(_ceiling_case(r)["step"]).tensors
    top = float(t["entropy"][_real_response_mask(t) > 0].max())
    return top / math.log(_run_model(r).config.vocab_size)


@exercise("07.2", "Predict, then verify with the temperature slider: the masked-mean entropy of recorded step 1 at "
          "T = 2.0 (3 decimals).",
          kind="predict",
          hints=("T > 1 flattens every distribution: the entropy grows with T, towards log V. Set the slider to 2.0 "
                 "and read the dot.",
                 "masked_mean(entropy_from_logits(scale_logits(response_logits, 2.0)), response_mask)."),
          rel=0.0, abs=5e-4, context=("run",), needs=("step1",))
def _e4(run=None) -> float:
    return step1_entropy(run, 2.0)


@exercise("07.5", "Predict, then verify: π_θ that forgets the temperature. At the first optimizer step of recorded "
          "step {step} (π_θ is still π_old), recompute π_θ's log-probs from the logits NOT divided by the rollout "
          "temperature T = {T}: on what share of that optimizer step's valid tokens ({rows} rows) is the ratio "
          "exp(log π_θ − old_log_probs) below 1? (3 decimals)",
          kind="predict",
          hints=("With the temperature the ratio is exactly 1 on every token. Without it π_θ is softmax(z) while "
                 "π_old sampled from softmax(z / T): for T < 1 which one gives the sampled, mostly likely, tokens "
                 "the higher probability? (The mean the next cell prints hides it: a few rare tokens get ratios "
                 "far above 1.)",
                 "forward_response(model, ids, attn, R, 1.0).log_probs on optimizer_step_batch(rec, 0)['rows'] "
                 "(ppolab.roles; at step 1 the model is the base model), then "
                 "masked_mean((ppo_clip_terms(old, lp, adv, ε, ε)['ratio'] < 1).float(), response_mask) — "
                 "first_ratio(run, 1.0) in ppolab.numbers.temperature gives the ratios (chapter §6, verl "
                 "transformer_impl.py::prepare_model_outputs)."),
          rel=0.0, abs=5e-4, context=("run",), needs=("step1", "opt_steps"), case=_temperature_case,
          default_run="grpo_temp_tiny")
def _e5(run=None) -> float:
    from ppolab.algos import masked_mean
    from ppolab.numbers.temperature import first_ratio

    _temperature_case(run)  # a run sampled at T = 1 lacks this (skipping T changes nothing there)
    f = first_ratio(run, 1.0)
    return masked_mean((f["ratio"] < 1).double(), f["response_mask"].double()).item()


@exercise("07.6", "The entropy bonus in the loss: at the first optimizer step of recorded step {step}, by how much "
          "does entropy_coeff = {entropy_coeff} move the actor loss — loss with the bonus minus loss without it "
          "(entropy_coeff 0)? π_θ is the base model there, at T = {T}.",
          kind="compute",
          hints=("verl subtracts the bonus: loss = pg_loss − entropy_coeff · entropy_loss, and entropy_loss is "
                 "aggregated like pg_loss (the run's loss_agg_mode over that optimizer step's response_mask), from "
                 "temperature-scaled logits.",
                 "−entropy_coeff · agg_loss(H, response_mask, loss_agg_mode), H = forward_response(model, ids, "
                 "attn, R, T, want_entropy=True).entropy on optimizer_step_batch(rec, 0)['rows'] — or "
                 "algos.ppo_loss(cfg, …, entropy=H) minus the same at entropy_coeff 0 (verl "
                 "workers/utils/losses.py::ppo_loss)."),
          rel=1e-5, abs=1e-8, context=("run",), needs=("step1", "opt_steps"), case=_entropy_bonus_case,
          default_run="grpo_temp_tiny")
def _e6(run=None) -> float:
    from ppolab.numbers.temperature import first_step_loss

    c = _entropy_bonus_case(run)
    return -c["entropy_coeff"] * first_step_loss(run)[1]["actor/entropy_loss"]
