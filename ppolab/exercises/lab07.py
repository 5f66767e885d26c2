"""Lab 07 — entropy and temperature (chapter §6)."""
from __future__ import annotations

import functools
import math

import torch

from ppolab import algos
from ppolab.exercises import exercise


@functools.lru_cache(maxsize=2)
def _model(path: str):
    from ppolab.models import load_tokenizer_and_model

    return load_tokenizer_and_model(path)[1]


def _run_model(run):
    from ppolab.numbers.kl import run_base_model

    return _model(str(run_base_model(run)))


def step1_entropy(run=None, temperature: float = 1.0) -> float:
    """Masked mean entropy of recorded step 1's response tokens under the base model at ``temperature``,
    through the trainer's own forward pass (``ppolab.roles.forward_response``)."""
    from ppolab.roles import forward_response
    from ppolab.record import resolve_run

    r = resolve_run(run)
    t = r.step(1).tensors
    ids = torch.cat([t["prompts"], t["responses"]], dim=1)
    mask = torch.cat([t["prompt_mask"], t["response_mask"].long()], dim=1)
    with torch.no_grad():
        out = forward_response(_run_model(r), ids, mask, t["responses"].shape[1], temperature,
                               want_log_probs=False, want_entropy=True)
    return algos.masked_mean(out.entropy, t["response_mask"]).item()


@exercise("07.1", "The masked-mean entropy of recorded step 1's response tokens at T = 0.5 (the base model, which is "
          "π_old at step 1).",
          hints=("Divide the response logits by T before the softmax, take each position's entropy, then average "
                 "over the response mask.",
                 "masked_mean(entropy_from_logits(scale_logits(response_logits, 0.5)), response_mask)."),
          rel=0.0, abs=2e-5, context=("run",), needs=("step1",))
def _e1(run=None) -> float:
    return step1_entropy(run, 0.5)


@exercise("07.2", "The ratio of the mean actor/entropy over the last 10 training steps to the mean over the first 10.",
          hints=("run.metrics['actor/entropy'] has one value per step (drop the missing ones); last 10 over "
                 "first 10.",
                 "ent = run.metrics['actor/entropy'].dropna(); ent.iloc[-10:].mean() / ent.iloc[:10].mean()."),
          context=("run",))
def _e2(run=None) -> float:
    from ppolab.record import resolve_run

    ent = resolve_run(run).metrics["actor/entropy"].dropna()
    return float(ent.iloc[-10:].mean() / ent.iloc[:10].mean())


@exercise("07.3", "The largest entropy (in nats) that any single response position can have under this model, at any "
          "temperature.",
          hints=("Which distribution over a finite vocabulary has the largest entropy, and how many tokens does "
                 "this model's vocabulary hold?",
                 "H_max = log V (natural log), V = model.config.vocab_size: the uniform distribution, reached as "
                 "T → ∞."),
          context=("run",))
def _e3(run=None) -> float:
    from ppolab.record import resolve_run

    return math.log(_run_model(resolve_run(run)).config.vocab_size)


@exercise("07.4", "Predict, then verify with the temperature slider: the masked-mean entropy of recorded step 1 at "
          "T = 2.0 (3 decimals).",
          hints=("T > 1 flattens every distribution: the entropy grows with T, towards log V. Set the slider to 2.0 "
                 "and read the dot.",
                 "masked_mean(entropy_from_logits(scale_logits(response_logits, 2.0)), response_mask)."),
          rel=0.0, abs=5e-4, context=("run",), needs=("step1",))
def _e4(run=None) -> float:
    return step1_entropy(run, 2.0)
