"""Lab 01 — one update, end to end: verl's nine stages (chapter §1)."""
from __future__ import annotations

import torch

from ppolab.exercises import exercise


def last_opt_step_case(run=None) -> dict:
    """Exercise 01.1's case: the first recorded step and its last optimizer step, with the batch plan's numbers."""
    from ppolab.numbers import resolve_run
    from ppolab.numbers.cases import steps_per_epoch
    from ppolab.numbers.steps import n_opt_steps

    r = resolve_run(run)
    s = r.steps[0]
    rec = r.step(s)
    n_opt, per = n_opt_steps(rec), steps_per_epoch(r, s)
    actor = r.ppo_config().actor_rollout_ref.actor
    rows = int(rec.tensors["responses"].shape[0])
    return {"step": s, "opt_step": n_opt - 1, "n_opt": n_opt, "rows": rows, "per_epoch": per,
            "mini": rows // max(1, per), "epochs": actor.ppo_epochs, "shuffle": str(actor.shuffle).lower()}


@exercise("01.1", "Predict, then verify: recorded step {step} holds {rows} rows; stage 9 takes {n_opt} optimizer steps "
                  "({epochs} epoch(s) × {per_epoch} mini-batch(es) of {mini} rows, shuffle = {shuffle}). How many "
                  "response tokens (response_mask = 1, real rows only) does its LAST optimizer step, optimizer step "
                  "{opt_step}, train on?",
          kind="predict",
          hints=("First find the rows: optimizer step k trains on the rows where actor_log_probs[k] is not NaN "
                 "(without shuffle, epoch e walks the same contiguous mini-batches again). Then count their "
                 "tokens, not the rows.",
                 "rows = ~torch.isnan(t['actor_log_probs'][{opt_step}]).all(-1) & ~t['is_pad'].bool(); answer "
                 "int(t['response_mask'][rows].sum())."),
          context=("run",), needs=("steps",), case=last_opt_step_case)
def _e1(run=None) -> int:
    from ppolab.numbers import optimizer_step_batch, resolve_run

    c = last_opt_step_case(run)
    b = optimizer_step_batch(resolve_run(run).step(c["step"]), c["opt_step"])
    return int(b["response_mask"].sum())   # response_mask of real rows only (padding rows zeroed)


@exercise("01.2", "How many response tokens of recorded step 1 enter the actor loss? Count each token once, real "
                  "rows only (not the prompt, not the padding).",
          kind="compute",
          hints=("Only positions with response_mask = 1 enter any loss; synthetic rows (is_pad = 1) have none.",
                 "int(t['response_mask'][~t['is_pad'].bool()].sum())"),
          context=("run",), needs=("step1",))
def _e2(run=None) -> int:
    from ppolab.numbers import step_tensors

    rec = step_tensors(run, 1)
    # the logged response_length/mean is the mean generated length over the real rows; rejection sampling (if on)
    # then dropped tokens from response_mask but not from loss_mask, the copy made at generation
    t = rec.tensors
    real = ~t["is_pad"].bool()
    rejected = int((t["loss_mask"].bool() & ~t["response_mask"].bool())[real].sum()) if "loss_mask" in t else 0
    return round(rec.info["metrics"]["response_length/mean"] * int(real.sum())) - rejected


def score_row_case(run=None) -> dict:
    """Exercise 01.3's case: in the first recorded step, the first real row with a non-zero score that does not sit
    in the last column (else the first row with a score), with the padded response width ``width``."""
    from ppolab.numbers import RunLacks, real_rows, resolve_run

    r = resolve_run(run)
    rec = r.step(r.steps[0])
    s = rec.tensors["token_level_scores"]
    scored = [i for i in range(s.shape[0]) if real_rows(rec)[i] and bool((s[i] != 0).any())]
    if not scored:
        raise RunLacks("a real row with a non-zero score in token_level_scores", r)
    inner = [i for i in scored if int(torch.nonzero(s[i]).flatten().max()) < s.shape[1] - 1]
    return {"step": rec.step, "row": (inner or scored)[0], "width": int(s.shape[1])}


@exercise("01.3", "Stage 2 (compute_reward) writes one score per trajectory into token_level_scores, a (rows, "
                  "{width}) tensor. In recorded step {step}, at which response position (0-based) does row {row}'s "
                  "score sit? Work it out from the row's mask (t['loss_mask'], the copy of response_mask made at "
                  "generation), then verify on token_level_scores.",
          kind="compute",
          hints=("The score belongs to the whole answer, so it sits on the last response token the model generated; "
                 "responses are right-padded, so that is not the last column of every row.",
                 "the last position where the row's generation-time mask is 1: "
                 "int(torch.nonzero(t['loss_mask'][{row}]).max()) — not the response length (that is one more), "
                 "and loss_mask rather than response_mask, which rejection sampling (stage 7) may have zeroed since."),
          context=("run",), needs=("steps",), case=score_row_case)
def _e3(run=None) -> int:
    from ppolab.numbers import resolve_run

    c = score_row_case(run)
    r = resolve_run(run)
    scores = r.step(c["step"]).tensors["token_level_scores"][c["row"]]
    return int(torch.nonzero(scores).flatten().max())   # where stage 2 put it: read off the recorded tensor
