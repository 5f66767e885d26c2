"""Solutions to lab 04's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
from ppolab import algos
import math

from ppolab.exercises.lab04 import below_window_case, code_case, predict_case
from ppolab.numbers import optimizer_step_batch, resolve_run, step_tensors
from ppolab.numbers.cases import run_eps

RUN = "ppo_fire_tiny"


def _batch(run=None, step=None, opt_step=None):
    c = predict_case(run)
    step = c["step"] if step is None else step
    opt_step = c["opt_step"] if opt_step is None else opt_step
    return optimizer_step_batch(step_tensors(run, step, default=RUN), opt_step)


def _code(run=None):  # exercise 04.3's (step, optimizer step) in this run
    c = code_case(run)
    return c["step"], c["opt_step"]


def _run_eps(run=None):  # the run's own ε, its clip window (0.07 for ppo_fire_tiny)
    return run_eps(resolve_run(run, default=RUN))


def clipfrac(run=None, step=None, opt_step=None, eps=0.05):
    b = _batch(run, step, opt_step)
    clipped = algos.ppo_clip_terms(b["old_log_probs"], b["log_prob"], b["advantages"], eps, eps)["clipped"]
    return algos.masked_mean(clipped, b["response_mask"]).item()


def clipfrac_at_0_05(run=None):
    return clipfrac(run)


def my_clipfrac(run=None):
    return clipfrac(run, *_code(run), eps=_run_eps(run))


def _clipped_count(run=None):
    b = _batch(run, *_code(run))
    eps = _run_eps(run)
    return int(algos.ppo_clip_terms(b["old_log_probs"], b["log_prob"], b["advantages"], eps, eps)["clipped"]
               [b["response_mask"].bool()].sum())


def _clipfrac_over_all_positions(run=None):
    b = _batch(run, *_code(run))
    eps = _run_eps(run)
    return algos.ppo_clip_terms(b["old_log_probs"], b["log_prob"], b["advantages"], eps, eps)["clipped"].mean().item()


def two_tokens(run=None, mistake=None):
    """04.1 as a learner writes it: each token's ratio and advantage from the recorded tensors, then the max."""
    c = below_window_case(run)
    t = resolve_run(run, default=RUN).step(c["step"]).tensors
    eps = _run_eps(run)
    out = []
    for row, pos in ((c["row_a"], c["pos_a"]), (c["row_b"], c["pos_b"])):
        adv = float(t["advantages"][row, pos])
        lp, old = float(t["actor_log_probs"][c["opt_step"]][row, pos]), float(t["old_log_probs"][row, pos])
        r = math.exp(old - lp) if mistake == "old_over_new" else math.exp(lp - old)
        clipped = min(max(r, 1 - eps), 1 + eps)
        if mistake == "min":                     # the minimised loss written with min, as the objective is
            loss = min(-adv * r, -adv * clipped)
        else:
            loss = max(-adv * r, -adv * clipped)
        flows = -adv * r >= -adv * clipped
        if mistake == "always_flows":            # the gradient is thought to flow whatever branch wins
            flows = True
        out.append((loss, flows))
    return tuple(out)


SOLUTIONS = {
    "04.1": two_tokens,
    "04.2": clipfrac_at_0_05,
    "04.3": my_clipfrac,
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # min instead of max; the ratio the wrong way round; the gradient said to flow on the clipped branch too;
    # the old stated-number answers (ε = 0.2, ratio 0.7, A = ±1)
    "04.1": [lambda run=None: two_tokens(run, "min"), lambda run=None: two_tokens(run, "old_over_new"),
             lambda run=None: two_tokens(run, "always_flows"), ((-0.7, True), (0.8, False))],
    # the run's own ε (what the explorer shows before the sliders move); nothing clipped; everything clipped;
    # verl's default ε = 0.2 (a wider window instead of a narrower one)
    "04.2": [lambda run=None: clipfrac(run, eps=_run_eps(run)), 0.0, 1.0, lambda run=None: clipfrac(run, eps=0.2)],
    # a count, not a fraction; averaged over every padded position; another optimizer step (the explorer's);
    # verl's default ε; ε = 0.1 (the value the run used before it was re-recorded at 0.07)
    # exercise 04.2's answer resubmitted (the previous cell's number, computed at ε 0.05 on another optimizer step)
    "04.3": [clipfrac_at_0_05, _clipped_count, _clipfrac_over_all_positions,
             lambda run=None: clipfrac(run, eps=_run_eps(run)),
             lambda run=None: clipfrac(run, *_code(run), eps=0.2),
             lambda run=None: clipfrac(run, *_code(run), eps=0.1)],
}
