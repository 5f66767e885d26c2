"""Lab 03 — from log-probabilities to the PPO ratio: exp, the ±20 clamp, drift across optimizer steps (§3, §3.1)."""
from __future__ import annotations

from ppolab import algos
from ppolab.exercises import exercise
from ppolab.numbers.cases import second_epoch_case


@exercise("03.1", "Predict, then verify with the drift figure: the largest ratio π_θ/π_old over the real response "
                  "tokens of recorded step 1, optimizer step {opt_step} (second epoch, first mini-batch). "
                  "(2 decimals)",
          kind="predict",
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


def push_case(run=None) -> dict:
    """Exercise 03.2's what-if: the first recorded step's last optimizer step (where π_θ has moved most from π_old)
    and a push ``what_if`` = 20 − half the largest positive log-ratio there, so that the tokens whose drift is past
    that half land beyond the clamp's edge and the others stay inside (a push of 20 where nothing drifted)."""
    from ppolab.numbers import optimizer_step_batch, resolve_run
    from ppolab.numbers.steps import n_opt_steps

    r = resolve_run(run)
    rec = r.step(r.steps[0])
    k = n_opt_steps(rec) - 1
    b = optimizer_step_batch(rec, k)
    d = (b["log_prob"] - b["old_log_probs"])[b["response_mask"] > 0]
    top = max(0.0, float(d.max())) if d.numel() else 0.0
    return {"step": rec.step, "opt_step": k, "what_if": round(20.0 - top / 2, 2)}


@exercise("03.2", "A what-if on this run's tensors: take recorded step {step}, optimizer step {opt_step}, and suppose "
                  "a bug added {what_if} to every log_prob (π_θ) of that optimizer step before the loss — "
                  "old_log_probs unchanged. On how many of its real response tokens would the ±20 clamp then act, "
                  "so that autograd through ppo_clip_terms returns ∂ratio/∂log_prob = 0?",
          kind="compute",
          hints=("The ratio uses log_prob − old_log_prob (new minus old), clamped to [−20, 20] before exp. After the "
                 "push, which tokens' log-ratio lies beyond 20? Inside the window ∂ratio/∂log_prob is the ratio "
                 "itself; outside, the clamp is flat.",
                 "b = optimizer_step_batch(run.step({step}), {opt_step}); d = (b['log_prob'] + {what_if}) − "
                 "b['old_log_probs']; answer int((d.abs() > 20)[b['response_mask'] > 0].sum()) — or push "
                 "log_prob through ppo_clip_terms with requires_grad and count the zero gradients."),
          context=("run",), needs=("steps",), case=push_case)
def _e2(run=None) -> int:
    from ppolab.numbers import optimizer_step_batch, resolve_run

    c = push_case(run)
    b = optimizer_step_batch(resolve_run(run).step(c["step"]), c["opt_step"])
    lp = (b["log_prob"] + c["what_if"]).detach().requires_grad_(True)
    algos.ppo_clip_terms(b["old_log_probs"], lp, b["advantages"], 0.2, 0.2)["ratio"].sum().backward()
    # the truth is autograd's own verdict: a zero gradient on a valid token is the clamp acting there
    return int(((lp.grad == 0) & (b["response_mask"] > 0)).sum())


def _clamp_case(run=None) -> dict:
    from ppolab.numbers.clamp import clamp_case

    return clamp_case(run)


@exercise("03.5", "The clamp on this run's own tensors: over the real response tokens of every optimizer step of "
                  "recorded step {step} (every actor_log_probs[k] of that step), what is the largest "
                  "|log_prob − old_log_prob|? (3 decimals) Compare it with the clamp's 20.",
          kind="compute",
          hints=("π_θ of optimizer step k is actor_log_probs[k] (NaN outside its mini-batch), π_old is old_log_probs. "
                 "Take the absolute log-ratio on the tokens with response_mask = 1 of real rows, over all of them.",
                 "max over k: (b['log_prob'] − b['old_log_probs']).abs()[b['response_mask'] > 0].max() with "
                 "b = optimizer_step_batch(run.step({step}), k); ppolab.numbers.largest_log_ratio(run, steps=[{step}]) "
                 "gives it and where it is."),
          rel=0.0, abs=5.1e-4, context=("run",), needs=("steps",), case=_clamp_case)
def _e5(run=None) -> float:
    from ppolab.numbers.clamp import largest_log_ratio

    return largest_log_ratio(run, steps=[_clamp_case(run)["step"]])["value"]
