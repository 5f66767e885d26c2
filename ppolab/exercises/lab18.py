"""Lab 18 — where the update went: what one optimizer step of the actor did to the tokens and to the parameters.

Every truth is the worker's own update, replayed on recorded step 1 (``ppolab.numbers.update_effect.step_effect``,
computed when the check runs; one replay per run is cached for the lab's cells, the explorer and these checks).
"""
from __future__ import annotations

from ppolab.exercises import exercise


def _effect(run, k: int):
    from ppolab.numbers.update_effect import step_effect

    return step_effect(run, 1, k)


def _n(run) -> int:
    from ppolab.numbers.update_effect import n_optimizer_steps

    return n_optimizer_steps(run, 1)


def _decoded(run, i: int, j: int) -> str:
    from ppolab.run.reader import resolve_run

    r = resolve_run(run)
    return r.tokenizer().decode([int(r.step(1).tensors["responses"][i, j])])


def _pick(e, where) -> tuple[int, int] | None:
    """The (row, position) of the token with the largest |advantage| among ``where`` (ties: the first)."""
    import torch

    score = torch.where(where, e["advantages"].abs() + 1e-6, torch.zeros_like(e["advantages"]))
    if float(score.max()) <= 0:
        return None
    return divmod(int(torch.argmax(score)), score.shape[1])


def _trained(e):
    return (e["mask"] > 0) & e["in_mini_batch"].unsqueeze(-1)


def later_step(run=None) -> int:
    """The first optimizer step after the first (the ratio has left 1), or 0 on a run with one optimizer step."""
    return 1 if _n(run) > 1 else 0


def two_tokens_case(run=None) -> dict:
    """Exercise 18.1's tokens at :func:`later_step`: A a token whose clip binds (else one with a negative
    advantage), B one inside the clip with a positive advantage (else any other trained token)."""
    from ppolab.numbers.needs import RunLacks

    k = later_step(run)
    e = _effect(run, k)
    trained = _trained(e)
    a = _pick(e, trained & (e["clip_state"] > 0)) or _pick(e, trained & (e["advantages"] < 0))
    b = _pick(e, trained & (e["clip_state"] == 0) & (e["advantages"] > 0))
    if a is None or b is None or a == b:
        raise RunLacks("two trained tokens of opposite kinds (clipped or negative advantage, and inside with a "
                       "positive one) at one optimizer step", run)
    from ppolab.i18n import tr
    from ppolab.numbers.update_effect import clip_state_name

    return {"opt_step": k, "row_a": a[0], "pos_a": a[1], "tok_a": _decoded(run, *a),
            "state_a": tr(clip_state_name(int(e["clip_state"][a]))), "row_b": b[0], "pos_b": b[1],
            "tok_b": _decoded(run, *b)}


@exercise("18.1", "Predict, then verify — optimizer step {opt_step} of recorded step 1. Token A: row {row_a}, "
                  "position {pos_a} ('{tok_a}', {state_a} at this optimizer step); token B: row {row_b}, "
                  "position {pos_b} ('{tok_b}', inside the clip, positive advantage). Which token's log-prob does "
                  "this one optimizer step raise more (the larger Δ log π, a fall counting as negative)? Answer "
                  "'A' or 'B'.",
          kind="predict",
          hints=("A token's own gradient is −A·r/N inside the clip and 0 where its clip binds; but every token shares "
                 "the same LoRA matrices, so a token with no gradient of its own still moves.",
                 "e = step_effect(run, 1, {opt_step}); compare e['delta'][{row_a}, {pos_a}] with "
                 "e['delta'][{row_b}, {pos_b}] (ppolab.numbers.update_effect)."),
          context=("run",), needs=("step1",), case=two_tokens_case)
def _e1(run=None) -> str:
    c = two_tokens_case(run)
    d = _effect(run, c["opt_step"])["delta"]
    return "A" if float(d[c["row_a"], c["pos_a"]]) > float(d[c["row_b"], c["pos_b"]]) else "B"


def coefficient_case(run=None) -> dict:
    """Exercise 18.2's token: at :func:`later_step`, the trained token inside the clip with the largest |A|."""
    from ppolab.numbers.needs import RunLacks

    k = later_step(run)
    e = _effect(run, k)
    tok = _pick(e, _trained(e) & (e["clip_state"] == 0) & (e["advantages"] != 0))
    if tok is None:
        raise RunLacks("a trained token inside the clip with a non-zero advantage", run)
    from ppolab.run.reader import resolve_run

    a = resolve_run(run).ppo_config().actor_rollout_ref.actor
    return {"opt_step": k, "row": tok[0], "pos": tok[1], "mode": a.loss_agg_mode, "loss_mode": a.policy_loss.loss_mode}


@exercise("18.2", "Compute — the policy-gradient coefficient of one token: ∂ pg_loss / ∂ log π of row {row}, position "
                  "{pos} at optimizer step {opt_step} of recorded step 1 (loss_mode {loss_mode}, loss_agg_mode "
                  "{mode}). This is what backward hands that token's log-prob; it is 0 where the token's clip binds. "
                  "Then check it against the replay's autograd. Answer a number.",
          kind="compute",
          hints=("Inside the clip the token's loss is −A·r with r = exp(log π − old log π), so ∂/∂log π = −A·r; the "
                 "aggregation divides it by the mini-batch's count (token-mean: batch_num_tokens of the update "
                 "plan, every rank's tokens; the seq-mean modes: global_batch_size and the row's own length). "
                 "log π before the step: step_effect(...)['log_prob_before'].",
                 "token-mean: −A·r / plan.steps[{opt_step}].batch_num_tokens with r = exp(log_prob_before − "
                 "old_log_probs) at [{row}, {pos}], × the rollout IS weight where the run has one; "
                 "plan = ppolab.update_plan.recorded_plan(run.step(1), run.ppo_config())."),
          rel=1e-4, abs=1e-9, context=("run",), needs=("step1", "vanilla_loss"), case=coefficient_case)
def _e2(run=None) -> float:
    c = coefficient_case(run)
    return float(_effect(run, c["opt_step"])["coefficient"][c["row"], c["pos"]])


def adam_case(run=None) -> dict:
    """Exercise 18.3's tensor: the last LoRA B (or the last trainable tensor) at optimizer step 1, where Adam's
    moments carry step 0 — a tensor and a step no cell of the lab prints."""
    from ppolab.numbers.needs import RunLacks
    from ppolab.run.reader import resolve_run

    r = resolve_run(run)
    if len(r.step(1).plan("actor").steps) < 2:
        raise RunLacks("a second actor optimizer step at step 1 (ppo_epochs × mini-batches ≥ 2)", r)
    names = _effect(r, 1)["names"]
    i = max((i for i, n in enumerate(names) if n.endswith("lora_B")), default=len(names) - 1)
    return {"index": i, "name": names[i], "numel": int(_effect(r, 1)["grads"][i].numel())}


@exercise("18.3", "Compute — Adam's second step on one tensor: {name} (index {index} of "
                  "step_effect(run, 1, k)['grads'], {numel} numbers). AdamW consumed its gradient g₀ at optimizer "
                  "step 0 and g₁ at optimizer step 1 "
                  "(step_effect(run, 1, k)['grads'][{index}], after the global-norm clip). From the two, the tensor "
                  "before step 1 (step_effect(run, 1, 1)['before'][{index}]), the lr of step 1 "
                  "(step_effect(run, 1, 1)['lr']) and AdamW's rule (eps = 1e-8; the run's betas and weight "
                  "decay), compute ‖Δθ‖ of optimizer step 1. Answer a number.",
          kind="compute",
          hints=("Adam keeps two running moments: after step 0, m = (1 − β₁)·g₀ and v = (1 − β₂)·g₀²; step 1 folds g₁ "
                 "in and divides by the bias corrections 1 − β₁² and 1 − β₂². The step is no longer lr·sign(g): an "
                 "entry whose gradient kept its sign moves by about lr, one that flipped moves less.",
                 "m = β₁(1 − β₁)g₀ + (1 − β₁)g₁; v = β₂(1 − β₂)g₀² + (1 − β₂)g₁²; d = lr·(m / (1 − β₁²)) / "
                 "(√(v / (1 − β₂²)) + 1e-8) + lr·wd·θ; answer float(d.norm()). Compare with Adam's first-step rule "
                 "applied to g₁ alone."),
          rel=1e-4, abs=0.0, context=("run",), needs=("step1",), case=adam_case)
def _e3(run=None) -> float:
    c = adam_case(run)
    return _effect(run, 1)["params"][c["index"]]["delta_norm"]


def zero_loss_case(run=None) -> dict:
    """Exercise 18.4's optimizer step — the first, on-policy one (ratio 1) — and an aggregation mode the run did not
    use and no cell of the lab replays: token-sum (token-mean on a run that uses token-sum)."""
    from ppolab.run.reader import resolve_run

    a = resolve_run(run).ppo_config().actor_rollout_ref.actor
    return {"opt_step": 0, "mode": a.loss_agg_mode, "other": "token-sum" if a.loss_agg_mode != "token-sum"
            else "token-mean"}


@exercise("18.4", "Compute — a counterfactual of the on-policy mini-batch: optimizer step 0 of recorded step 1, where "
                  "π_θ = π_old and every ratio is 1, was trained with loss_agg_mode {mode}. Had it used {other} — the "
                  "same rows, weights and global counts — what would (a) its loss (Σ over micro-batches of pg − "
                  "entropy_coeff·entropy + kl_loss_coef·kl, as the worker sums it) and (b) the norm of its gradient "
                  "before the clip have been? Answer (loss, gradient norm).",
          kind="compute",
          hints=("At ratio 1 the policy loss is the aggregated −A. {other} changes only how the tokens are weighed "
                 "and divided (§10): the size of the loss and of every token's pull, never the sign of a token's "
                 "pull.",
                 "replay_actor_update(run, loss_agg_mode='{other}') replays optimizer step 0 through the actor "
                 "worker under that mode; its metrics hold the loss (actor/loss) and the gradient norm before the "
                 "clip (actor/grad_norm)."),
          rel=1e-4, abs=1e-6, context=("run",), needs=("step1", "vanilla_loss"), case=zero_loss_case)
def _e4(run=None) -> tuple[float, float]:
    from ppolab.replay import replay_actor_update

    m = replay_actor_update(run, loss_agg_mode=zero_loss_case(run)["other"])["metrics"]
    return float(m["actor/loss"]), float(m["actor/grad_norm"])


def sgd_pull_case(run=None) -> dict:
    """Exercise 18.5's token: 18.2's (the trained token inside the clip with the largest |A| at :func:`later_step`),
    and the sign of its advantage."""
    from ppolab.i18n import tr

    c = coefficient_case(run)
    e = _effect(run, c["opt_step"])
    positive = float(e["advantages"][c["row"], c["pos"]]) > 0
    return {"opt_step": c["opt_step"], "row": c["row"], "pos": c["pos"],
            "sign": tr("a positive advantage" if positive else "a negative advantage")}


@exercise("18.5", "Compute — one token's own pull, had the step been plain SGD: row {row}, position {pos} at optimizer "
                  "step {opt_step} of recorded step 1 (inside the clip, {sign}). Its own part of the "
                  "first-order move is clip · c · ∇ log π · (gain ⊙ ∇ log π) under AdamW (token_moves). Had the "
                  "optimizer been plain SGD at the same lr — Δθ = −lr · g, g the clipped gradient — its own part "
                  "would have been −lr · clip · c · ‖∇_θ log π‖². Compute that number: ∇_θ log π of this one token "
                  "over the actor's trainable tensors, at the weights before the step. Answer a number.",
          kind="compute",
          hints=("c is the token's coefficient ∂ pg_loss / ∂ log π (18.2), clip the global-norm clip's factor "
                 "(step_effect(...)['clip_coef']), lr step_effect(...)['lr']; ∇_θ log π needs one backward of this "
                 "token's log-prob alone.",
                 "e = step_effect(run, 1, {opt_step}); g = token_gradients(run, 1, e, [({row}, {pos})])[0] "
                 "(ppolab.numbers.token_moves); answer −e['lr'] · e['clip_coef'] · e['coefficient'][{row}, {pos}] · "
                 "Σ (x ** 2).sum() over the tensors x of g. Compare with token_moves(run, 1, {opt_step}, "
                 "[({row}, {pos})])[0]['own']: how many times larger is AdamW's?"),
          rel=1e-3, abs=1e-12, context=("run",), needs=("step1", "vanilla_loss"), case=sgd_pull_case)
def _e5(run=None) -> float:
    from ppolab.numbers.token_moves import token_gradients
    from ppolab.run.reader import resolve_run

    c = sgd_pull_case(run)
    e = _effect(run, c["opt_step"])
    (g,) = token_gradients(resolve_run(run), 1, e, [(c["row"], c["pos"])])
    squared = float(sum(float((x.double() ** 2).sum()) for x in g))
    return -e["lr"] * e["clip_coef"] * float(e["coefficient"][c["row"], c["pos"]]) * squared
