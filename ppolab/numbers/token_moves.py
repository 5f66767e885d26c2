"""Why a token moved: the first-order account of one optimizer step's effect on a token's log-prob (chapter §1's
"actor backward → optimizer.step()", §4's clip; lab 18).

An optimizer step moves the shared weights by Δθ, so to first order a token's log-prob moves by
∇_θ log π · Δθ — a dot product of the token's own gradient with the step every token shares. AdamW's step splits
exactly into three parts (:func:`ppolab.numbers.update_effect.adamw_step_parts`):

    Δθ = decay + momentum + gain ⊙ g,     g = clip · (Σ_tokens c_j ∇ log π_j + the other loss terms' gradients)

with c_j = ∂ pg_loss / ∂ log π_j the coefficient backward hands token j (0 where its clip binds) and ``clip`` the
global-norm clip's factor. So the first-order move of token i is the sum of

    own      = clip · c_i · ∇ log π_i · (gain ⊙ ∇ log π_i)   its own pull: the sign of its advantage, 0 when clipped
    rest     = ∇ log π_i · (gain ⊙ g) − own               every other token of the mini-batch and the other terms
    momentum = ∇ log π_i · momentum                       the earlier optimizer steps Adam still carries
    decay    = ∇ log π_i · decay                          AdamW's weight decay

(gain < 0 entry by entry and c_i = −A·r/N inside the clip, so ``own`` always has the sign of A). A clipped token
or a row outside the mini-batch has no ``own``: it moves by ``rest`` alone, and a token moves against its own
advantage where ``rest`` outweighs ``own``. What the weights did beyond first order is ``realised − first_order``.

    moves = token_moves(run, step=1, opt_step=1)   # the telling tokens of that optimizer step
    moves[0]["kind"], moves[0]["realised"], moves[0]["first_order"], moves[0]["own"], moves[0]["rest"]
"""
from __future__ import annotations

import os
from typing import Any

import torch

from ppolab.batch import to_device, trimmed_inputs
from ppolab.errors import whole_argument
from ppolab.numbers.update_effect import n_optimizer_steps, step_batch, step_effect
from ppolab.run.reader import Run, resolve_run

#: The kinds of token :func:`telling_tokens` looks for, in the order it lists them.
KINDS = ("inside, with its advantage", "inside, against its advantage", "clipped", "not in this mini-batch")


def telling_tokens(e: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(kind, row, position) of the tokens that tell the story of one optimizer step (``e``: a
    :func:`~ppolab.numbers.update_effect.step_effect` dict): among the real response tokens, the one that moved most
    (largest |Δ log π|) of each of :data:`KINDS` the step has — trained inside the clip and moved in its
    advantage's direction, trained inside the clip and moved against it, trained with its clip binding, and in a
    row this optimizer step did not train."""
    delta, adv, state = e["delta"], e["advantages"], e["clip_state"]
    real = (e["mask"] > 0) & ~torch.isnan(delta)
    trained = real & e["in_mini_batch"].unsqueeze(-1)
    inside = trained & (state == 0) & (adv != 0)
    same = torch.sign(delta) == torch.sign(adv)
    where = {KINDS[0]: inside & same, KINDS[1]: inside & ~same, KINDS[2]: trained & (state > 0),
             KINDS[3]: real & (state == -2)}
    out = []
    for kind, ok in where.items():
        if bool(ok.any()):
            score = torch.where(ok, delta.abs().nan_to_num(0.0) + 1e-12, torch.zeros_like(adv))
            row, pos = divmod(int(torch.argmax(score)), score.shape[1])
            out.append((kind, row, pos))
    return out


def with_advantage_fraction(e: dict[str, Any]) -> float:
    """The share of an optimizer step's trained tokens (non-zero advantage) whose log-prob moved in their
    advantage's direction (Δ log π of A's sign); NaN on a step with none."""
    delta, adv = e["delta"], e["advantages"]
    trained = (e["mask"] > 0) & e["in_mini_batch"].unsqueeze(-1) & (adv != 0) & ~torch.isnan(delta)
    if not bool(trained.any()):
        return float("nan")
    return float((torch.sign(delta[trained]) == torch.sign(adv[trained])).float().mean())


def token_gradients(run: Run, step: int, e: dict[str, Any], tokens: list[tuple[int, int]]) -> list[list[torch.Tensor]]:
    """∇_θ log π of each (row, position) of ``tokens`` with respect to the actor's trainable tensors, at the weights
    before optimizer step ``e["opt_step"]`` (``e["before"]``): one forward per row (the worker's forward, the run's
    temperature and layout), one backward per token. The shared models are put back afterwards."""
    from ppolab.replay import REPLAY_LOCK, restore, run_models
    from ppolab.worker import ActorWorker
    from ppolab.models import forward_response

    cfg = run.ppo_config()
    batch = step_batch(run, step)
    out: dict[tuple[int, int], list[torch.Tensor]] = {}
    with REPLAY_LOCK:
        models = run_models(run)
        params = models.actor_parameters()
        saved = [p.detach().clone() for p in params]
        worker = ActorWorker(cfg.actor_rollout_ref.actor, models, temperature=cfg.actor_rollout_ref.rollout.temperature,
                             rollout_n=cfg.actor_rollout_ref.rollout.n)
        try:
            restore(params, e["before"])
            with torch.enable_grad():
                for row in sorted({r for r, _ in tokens}):
                    ids, mask, r_len = trimmed_inputs(to_device(batch.select([row]), models.device))
                    with worker.model() as model:
                        lp = forward_response(model, ids, mask, r_len, worker.temperature, True,
                                              remove_padding=worker.remove_padding).log_probs
                    for r, pos in tokens:
                        if r == row:
                            g = torch.autograd.grad(lp[0, pos], params, retain_graph=True, allow_unused=True)
                            out[(r, pos)] = [torch.zeros_like(p) if x is None else x.detach().cpu()
                                             for p, x in zip(params, g)]
        finally:
            restore(params, saved)
    return [out[t] for t in tokens]


def _dot(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return float(sum(torch.dot(x.flatten().double(), y.flatten().double()) for x, y in zip(a, b)))


def token_moves(run: Run | str | os.PathLike | None = None, step: int = 1, opt_step: int = 0,
                tokens: list[tuple[int, int]] | None = None) -> list[dict[str, Any]]:
    """The first-order account (module docstring) of each token of ``tokens`` — (row, position) pairs; None: the
    :func:`telling_tokens` of that optimizer step — at actor optimizer step ``opt_step`` of recorded step ``step``.
    One dict per token: ``kind`` (None for a token the caller named), ``row``, ``pos``, ``advantage``,
    ``clip_state``, ``coefficient``, ``realised`` (Δ log π the step made, measured), ``first_order``
    (∇ log π · Δθ), and its parts ``own``, ``rest``, ``momentum``, ``decay``."""
    r = resolve_run(run)
    step = whole_argument("step", step, None, "a recorded step's number")
    opt_step = whole_argument("opt_step", opt_step, range(n_optimizer_steps(r, step)),
                              f"an optimizer step of the actor's update at step {step}")
    e = step_effect(r, step, opt_step)
    n, width = e["mask"].shape
    if tokens is None:
        named = telling_tokens(e)
    else:
        named = []
        for i, t in enumerate(tokens):
            if not (isinstance(t, (tuple, list)) and len(t) == 2):
                raise ValueError(f"tokens[{i}]={t!r} is not a (row, position) pair")
            row = whole_argument(f"tokens[{i}] row", t[0], range(n), "a row of the step's batch")
            pos = whole_argument(f"tokens[{i}] position", t[1], range(width), "a response position")
            if not bool(e["mask"][row, pos] > 0):
                raise ValueError(f"tokens[{i}]=({row}, {pos}) is not a response token of step {step} (its "
                                 "response_mask is 0): name a position inside the row's response")
            named.append((None, row, pos))
    grads = token_gradients(r, step, e, [(row, pos) for _, row, pos in named])
    parts, clip = e["adam"], e["clip_coef"]
    moves = []
    for (kind, row, pos), g in zip(named, grads):
        c = float(e["coefficient"][row, pos])
        own = clip * c * _dot(g, [gain * x for gain, x in zip(parts["gain"], g)]) if c != 0 else 0.0
        moves.append({
            "kind": kind, "row": row, "pos": pos, "advantage": float(e["advantages"][row, pos]),
            "clip_state": int(e["clip_state"][row, pos]), "coefficient": c,
            "realised": float(e["delta"][row, pos]), "first_order": _dot(g, e["update"]),
            "own": own, "rest": _dot(g, [gain * u for gain, u in zip(parts["gain"], e["grads"])]) - own,
            "momentum": _dot(g, parts["momentum"]), "decay": _dot(g, parts["decay"]),
        })
    return moves


def telling_step(run: Run | str | os.PathLike | None = None, step: int = 1) -> int:
    """The optimizer step of ``step`` whose tokens tell most (lab 18's account): the first after the first where a
    trained token's clip binds, else the last (the ratio has left 1 there), else 0 on a one-step update."""
    n = n_optimizer_steps(run, step)
    for k in range(1, n):
        e = step_effect(run, step, k)
        if bool(((e["clip_state"] > 0) & e["in_mini_batch"].unsqueeze(-1)).any()):
            return k
    return n - 1
