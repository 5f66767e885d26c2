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
    r = resolve_run(run)
    c = adam_case(r)
    e = step_effect(r, 1, 0)
    optim = r.ppo_config().actor_rollout_ref.actor.optim
    g, theta = e["grads"][c["index"]], e["before"][c["index"]]  # a LoRA B starts at 0
    lr = e["lr"]
    if rule == "sgd":
        return lr * float(g.norm())
    step = lr * g / (g.abs() + 1e-8)  # Adam's first step: m̂ = g, v̂ = g²
    decay = lr * optim.weight_decay * theta if rule == "adam" else torch.zeros_like(theta)
    return float((step + decay).norm())


def _vanilla(lp, old, adv, eps_low, eps_high, c):
    ratio = torch.exp(torch.clamp(lp - old, -20, 20))
    clipped = torch.maximum(-adv * ratio, -adv * torch.clamp(ratio, 1 - eps_low, 1 + eps_high))
    return torch.where(adv < 0, torch.minimum(clipped, -adv * c), clipped)


def zero_loss(run=None, grad="terms"):
    r = resolve_run(run)
    rec = r.step(1)
    e = step_effect(r, 1, 0)
    opt = recorded_plan(rec, r.ppo_config()).steps[0]
    rows = opt.rows()
    a = r.ppo_config().actor_rollout_ref.actor
    eps_low = a.clip_ratio_low if a.clip_ratio_low is not None else a.clip_ratio
    eps_high = a.clip_ratio_high if a.clip_ratio_high is not None else a.clip_ratio
    loss = _vanilla(e["log_prob_before"][rows], rec["old_log_probs"][rows].float(),
                    rec["advantages"][rows].float(), eps_low, eps_high, a.clip_ratio_c)  # every ratio ≈ 1 here
    if "rollout_is_weights" in rec.tensors:
        loss = loss * rec["rollout_is_weights"][rows].float()
    mask = e["mask"][rows]
    loss = torch.where(mask > 0, loss, torch.zeros_like(loss))
    if a.loss_agg_mode == "token-mean":
        value = float((loss * mask).sum() / opt.batch_num_tokens)
    else:  # seq-mean-token-mean
        per_row = (loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        value = float(per_row.sum() / opt.global_batch_size)
    value += sum(v for k, v in e["term_losses"].items() if k != "pg")  # the entropy and KL terms as summed
    total = [sum(t[i] for t in e["terms"].values()) for i in range(len(e["grads"]))]
    norm = float(torch.cat([g.flatten() for g in total]).norm())
    return value, (0.0 if grad == "zero" else norm)


SOLUTIONS = {
    "18.1": which_rises,
    "18.2": coefficient,
    "18.3": adam_norm,
    "18.4": zero_loss,
}

#: Plausible wrong answers: each must be told "not yet".
WRONG = {
    # the other token
    "18.1": [lambda run=None: which_rises(run, flip=True)],
    # the ratio taken as 1 (on-policy thinking); the count of the mini-batch's response tokens without the loss mask's
    # global count; the sign flipped
    "18.2": [lambda run=None: coefficient(run, ratio_one=True), lambda run=None: -coefficient(run)],
    # the step plain SGD would take; a step of lr · ‖g‖ / ‖g‖ = lr (Adam read as "normalise the whole gradient")
    "18.3": [lambda run=None: adam_norm(run, "sgd"),
             lambda run=None: step_effect(run, 1, 0)["lr"]],
    # "a zero loss has a zero gradient"; the loss with the gradient's sign
    "18.4": [lambda run=None: zero_loss(run, grad="zero"), lambda run=None: (0.0, 0.0)],
}
