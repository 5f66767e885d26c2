"""Lab 03 — from log-probabilities to the PPO ratio: exp, the ±20 clamp, drift across optimizer steps (§3, §3.1)."""
from __future__ import annotations

import torch

from ppolab import algos
from ppolab.exercises import exercise
from ppolab.numbers.cases import second_epoch_case


def _t(x: float, grad: bool = False) -> torch.Tensor:
    return torch.tensor([[x]], dtype=torch.float64, requires_grad=grad)


@exercise("03.1", "Predict, then verify with the drift figure: the largest ratio π_θ/π_old over the real response "
                  "tokens of recorded step 1, optimizer step {opt_step} (second epoch, first mini-batch). "
                  "(2 decimals)",
          hints=("Optimizer step {opt_step} sees the rows of optimizer step 0 again, after {opt_step} updates. Does "
                 "the PPO clip (ε = 0.2) stop the ratio itself from going past 1.2?",
                 "ratio = exp(actor_log_probs[{opt_step}] − old_log_probs) on optimizer_step_batch(run.step(1), "
                 "{opt_step}), masked by its response_mask; answer its max. The clip bounds the loss, not the ratio."),
          rel=0.0, abs=5.1e-3, context=("run",), needs=("step1", "epochs", "unshuffled"), case=second_epoch_case)
def _e1(run=None) -> float:
    from ppolab.numbers import optimizer_step_batch, step_tensors

    b = optimizer_step_batch(step_tensors(run, 1), second_epoch_case(run)["opt_step"])
    ratio = algos.ppo_clip_terms(b["old_log_probs"], b["log_prob"], b["advantages"], 0.2, 0.2)["ratio"]
    return ratio[b["response_mask"].bool()].max().item()


@exercise("03.2", "A token had old_log_prob = −2.0; after some updates its log_prob is −2.5. What ratio does the "
                  "loss use? (3 decimals)",
          hints=("The ratio is π_θ/π_old, and the trainer only stores logarithms. Which one is subtracted from "
                 "which?",
                 "ratio = exp(clamp(log_prob − old_log_prob, −20, 20)) = exp(−2.5 − (−2.0))."),
          rel=0.0, abs=5.1e-4)
def _e2() -> float:
    return algos.ppo_clip_terms(_t(-2.0), _t(-2.5), _t(1.0), 0.2, 0.2)["ratio"].item()


@exercise("03.3", "A token's raw log-ratio log_prob − old_log_prob is +30. What ratio does the code actually use?",
          hints=("Before exponentiating, verl clamps the log-ratio (compute_policy_loss_vanilla). To what "
                 "window?",
                 "ratio = exp(clamp(30, −20, 20)) = e^20 ≈ 4.85e8 — not e^30, and not the PPO clip 1 + ε."))
def _e3() -> float:
    return algos.ppo_clip_terms(_t(0.0), _t(30.0), _t(1.0), 0.2, 0.2)["ratio"].item()


@exercise("03.4", "And the gradient: for that token (raw log-ratio +30, A = +1, ε = 0.2), what is ∂ratio/∂log_prob "
                  "as the code computes it?",
          hints=("Inside the ±20 window ∂ratio/∂log_prob = ratio. What does torch.clamp pass back for an input "
                 "outside its window?",
                 "Outside [−20, 20] the clamp is constant, so its gradient is 0: ∂ratio/∂log_prob = 0 (the ratio "
                 "saturates, chapter §3)."))
def _e4() -> float:
    lp = _t(30.0, grad=True)
    algos.ppo_clip_terms(_t(0.0), lp, _t(1.0), 0.2, 0.2)["ratio"].sum().backward()
    return lp.grad.item()


def _clamp_case(run=None) -> dict:
    from ppolab.numbers.clamp import clamp_case

    return clamp_case(run)


@exercise("03.5", "The clamp on this run's own tensors: over the real response tokens of every optimizer step of "
                  "recorded step {step} (every actor_log_probs[k] of that step), what is the largest "
                  "|log_prob − old_log_prob|? (3 decimals) Compare it with the clamp's 20.",
          hints=("π_θ of optimizer step k is actor_log_probs[k] (NaN outside its mini-batch), π_old is old_log_probs. "
                 "Take the absolute log-ratio on the tokens with response_mask = 1 of real rows, over all of them.",
                 "max over k: (b['log_prob'] − b['old_log_probs']).abs()[b['response_mask'] > 0].max() with "
                 "b = optimizer_step_batch(run.step({step}), k); ppolab.numbers.largest_log_ratio(run, steps=[{step}]) "
                 "gives it and where it is."),
          rel=0.0, abs=5.1e-4, context=("run",), needs=("steps",), case=_clamp_case)
def _e5(run=None) -> float:
    from ppolab.numbers.clamp import largest_log_ratio

    return largest_log_ratio(run, steps=[_clamp_case(run)["step"]])["value"]
