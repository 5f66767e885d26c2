"""Solutions to lab 04's exercises (kept out of the notebook). A callable solution is the code a learner
would write; it is called with the exercise's context (e.g. ``run``)."""
from ppolab import algos
from ppolab.widgets.common import optimizer_step_batch, step_tensors

RUN = "ppo_fire_tiny"


def _batch(run=None, step=24, opt_step=8):
    return optimizer_step_batch(step_tensors(run, step, default=RUN), opt_step)


def clipfrac(run=None, step=24, opt_step=8, eps=0.05):
    b = _batch(run, step, opt_step)
    clipped = algos.ppo_clip_terms(b["old_log_probs"], b["log_prob"], b["advantages"], eps, eps)["clipped"]
    return algos.masked_mean(clipped, b["response_mask"]).item()


def clipfrac_at_0_05(run=None):
    return clipfrac(run)


def my_clipfrac(run=None):
    return clipfrac(run, opt_step=12, eps=0.1)


def _clipped_count(run=None):
    b = _batch(run, opt_step=12)
    return int(algos.ppo_clip_terms(b["old_log_probs"], b["log_prob"], b["advantages"], 0.1, 0.1)["clipped"]
               [b["response_mask"].bool()].sum())


def _clipfrac_over_all_positions(run=None):
    b = _batch(run, opt_step=12)
    return algos.ppo_clip_terms(b["old_log_probs"], b["log_prob"], b["advantages"], 0.1, 0.1)["clipped"].mean().item()


SOLUTIONS = {
    "04.1": (-0.7, True),
    "04.2": clipfrac_at_0_05,
    "04.3": my_clipfrac,
    "04.4": (0.8, False),
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    "04.1": [(-0.8, False), (-0.7, False), (-0.8, True), (0.7, True)],
    # the run's own ε (what the explorer shows before the sliders move); nothing clipped; everything clipped;
    # verl's default ε = 0.2 (a wider window instead of a narrower one)
    "04.2": [lambda run=None: clipfrac(run, eps=0.1), 0.0, 1.0, lambda run=None: clipfrac(run, eps=0.2)],
    # a count, not a fraction; averaged over every padded position; another optimizer step; verl's default ε
    "04.3": [_clipped_count, _clipfrac_over_all_positions, lambda run=None: clipfrac(run, opt_step=8, eps=0.1),
             lambda run=None: clipfrac(run, opt_step=12, eps=0.2)],
    # the unclipped branch with the gradient flowing; the right loss but a flowing gradient; the wrong sign
    "04.4": [(0.7, True), (0.8, True), (-0.8, False), (0.7, False)],
}
