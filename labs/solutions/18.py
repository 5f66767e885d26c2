"""Solutions to lab 18's exercises (kept out of the notebook). A callable solution is the code a learner would
write; it is called with the exercise's context (``run``)."""
import torch

from ppolab.exercises.lab18 import adam_case, coefficient_case, two_tokens_case
from ppolab.numbers.update_effect import step_effect
from ppolab.run.reader import resolve_run
from ppolab.update_plan import recorded_plan


def which_rises(run=None, flip=False):
    c = two_tokens_case(run)
    d = step_effect(run, 1, c["opt_step"])["delta"]
    a_more = float(d[c["row_a"], c["pos_a"]]) > float(d[c["row_b"], c["pos_b"]])
    return "A" if a_more != flip else "B"


def coefficient(run=None, ratio_one=False, plain_count=False):
    """−A·r / N for token-mean (the seq-mean modes: / (global_batch_size · the row's token count))."""
    r = resolve_run(run)
    c = coefficient_case(r)
    rec = r.step(1)
    e = step_effect(r, 1, c["opt_step"])
    i, j = c["row"], c["pos"]
    ratio = 1.0 if ratio_one else float(torch.exp(e["log_prob_before"][i, j] - rec["old_log_probs"][i, j]))
    adv = float(rec["advantages"][i, j])
    if "rollout_is_weights" in rec.tensors:
        adv *= float(rec["rollout_is_weights"][i, j])
    opt = recorded_plan(rec, r.ppo_config()).steps[c["opt_step"]]
    if c["mode"] == "token-mean":
        n = float(e["mask"][opt.rows()].sum()) if plain_count else opt.batch_num_tokens
        return -adv * ratio / n
    tokens = float(e["mask"][i].sum())
    return -adv * ratio / (opt.global_batch_size * tokens)


def adam_norm(run=None, rule="adam"):
    """‖Δθ‖ of optimizer step 1 on 18.3's tensor: Adam with the moments step 0 left (``rule``: "first" applies the
    first-step rule to g₁ alone, "sgd" plain SGD, "no_bias" the moments without their corrections)."""
    r = resolve_run(run)
    c = adam_case(r)
    e0, e1 = step_effect(r, 1, 0), step_effect(r, 1, 1)
    optim = r.ppo_config().actor_rollout_ref.actor.optim
    b1, b2 = optim.betas
    g0, g1, theta, lr = e0["grads"][c["index"]], e1["grads"][c["index"]], e1["before"][c["index"]], e1["lr"]
    if rule == "sgd":
        return lr * float(g1.norm())
    m = b1 * (1 - b1) * g0 + (1 - b1) * g1
    v = b2 * (1 - b2) * g0 ** 2 + (1 - b2) * g1 ** 2
    if rule == "first":
        m, v = g1 * (1 - b1 ** 2), g1 ** 2 * (1 - b2 ** 2)
    corr1, corr2 = (1.0, 1.0) if rule == "no_bias" else (1 - b1 ** 2, 1 - b2 ** 2)
    step = lr * (m / corr1) / ((v / corr2).sqrt() + 1e-8)
    return float((step + lr * optim.weight_decay * theta).norm())


def counterfactual_loss(run=None, mode=None):
    """(loss, gradient norm) of optimizer step 0 replayed under 18.4's other aggregation mode (or ``mode``)."""
    from ppolab.exercises.lab18 import zero_loss_case
    from ppolab.replay import replay_actor_update

    x = replay_actor_update(run, loss_agg_mode=mode or zero_loss_case(run)["other"])
    return float(x["metrics"]["actor/loss"]), float(torch.cat([g.flatten() for g in x["grads"]]).norm())


def own_mode(run=None):
    """The step as the run trained it: its own mode (what cell 4 prints)."""
    e = step_effect(run, 1, 0)
    return e["loss"], e["grad_norm"]


def sgd_pull(run=None, norm=False, adam=False):
    """18.5: −lr · clip · c · ‖∇ log π‖² of the token (``norm``: ‖∇ log π‖ unsquared; ``adam``: AdamW's own part,
    token_moves' ``own``)."""
    from ppolab.exercises.lab18 import sgd_pull_case
    from ppolab.numbers.token_moves import token_gradients, token_moves

    c = sgd_pull_case(run)
    if adam:
        return token_moves(run, 1, c["opt_step"], [(c["row"], c["pos"])])[0]["own"]
    e = step_effect(run, 1, c["opt_step"])
    (g,) = token_gradients(resolve_run(run), 1, e, [(c["row"], c["pos"])])
    squared = sum(float((x ** 2).sum()) for x in g)
    size = squared ** 0.5 if norm else squared
    return -e["lr"] * e["clip_coef"] * float(e["coefficient"][c["row"], c["pos"]]) * size


SOLUTIONS = {
    "18.1": which_rises,
    "18.2": coefficient,
    "18.3": adam_norm,
    "18.4": counterfactual_loss,
    "18.5": sgd_pull,
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # the other token
    "18.1": [lambda run=None: which_rises(run, flip=True)],
    # the ratio taken as 1 (on-policy thinking); the count of the mini-batch's response tokens without the loss mask's
    # global count; the sign flipped
    "18.2": [lambda run=None: coefficient(run, ratio_one=True), lambda run=None: -coefficient(run)],
    # the step plain SGD would take; Adam's first-step rule on g₁ alone (the moments forgotten); the moments
    # without their bias corrections
    "18.3": [lambda run=None: adam_norm(run, "sgd"), lambda run=None: adam_norm(run, "first"),
             lambda run=None: adam_norm(run, "no_bias")],
    # the step as the run trained it (cell 4); "a zero loss has a zero gradient"; the other mode's loss with the run's
    # own gradient norm
    "18.4": [own_mode, lambda run=None: (0.0, 0.0),
             lambda run=None: (counterfactual_loss(run)[0], own_mode(run)[1])],
    # AdamW's own part (token_moves' own, not the SGD what-if); the norm unsquared; the sign flipped (the
    # coefficient's sign, not the step's: the step runs against the gradient)
    "18.5": [lambda run=None: sgd_pull(run, adam=True), lambda run=None: sgd_pull(run, norm=True),
             lambda run=None: -sgd_pull(run)],
}
