"""Where the update went: one recorded optimizer step of the actor, replayed with the worker's own code, and what it
did to the parameters and to every token — the chapter's title question, *PPO loss 怎样真正更新参数* (§1:
advantages → policy loss → actor backward → optimizer.step()).

The replay is the training code path: an :class:`~ppolab.worker.ActorWorker` built from the run's config with the
AdamW and warm-up the trainer builds (``make_optimizer``), executing the step's recorded update plan
(:func:`ppolab.update_plan.recorded_plan`) with :meth:`~ppolab.worker.Worker.optimizer_step_of`. Only step 1 starts
from a state a fresh trainer holds — the seeded adapter (LoRA B = 0), an empty Adam state — so optimizer step k of
step 1 is replayed by running steps 0 … k−1 as recorded, then measuring step k. A run trained on several ranks is
replayed on one process: every rank's micro-batches in rank order, normalised with dp_size 1, which is the gradient
the ranks averaged (up to float rounding).

    e = step_effect(run, step=1, opt_step=2)
    e["delta"]            # (N, R) log π after − before, every row of the step (NaN off the mask)
    e["clip_state"]       # (N, R) 0 inside, 1 clipped above, 2 clipped below, 3 dual-clipped; −1 masked, −2 a row
                          # this optimizer step did not train
    e["coefficient"]      # (N, R) ∂ pg_loss / ∂ log π of each token of the step (0 where its clip binds)
    e["params"]           # per trainable tensor: ‖grad‖, ‖Δθ‖, ‖lr·grad‖ (a plain SGD step), cos(Δθ, −grad)
    e["terms"]            # loss term → per-tensor gradients of that term alone (the entropy bonus and the KL loss:
                          # backward passes of their own; pg: the step's gradient minus theirs)
    e["adam"]             # AdamW's step split per tensor: decay + momentum + gain ⊙ grads (adamw_step_parts)
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any

import torch

from ppolab import algos
from ppolab.algos.policy_loss import clip_bounds
from ppolab.batch import Batch
from ppolab.numbers.needs import RunLacks
from ppolab.errors import whole_argument
from ppolab.run.reader import Run, cache_slot, resolve_run
from ppolab.update_plan import InferBatching, OptimizerStep

#: Clip states of :func:`step_effect` (``clip_state``), by code.
CLIP_STATES = ("inside", "clipped above", "clipped below", "dual-clipped")

#: Per run and step (keyed by :meth:`Run.identity`: a run replaced at the same path, or a step recorded again, is
#: another entry): ``steps``, what each optimizer step measured so far did (k → :func:`step_effect`'s dict), and
#: ``worker``, the optimizer's state after the last of them, so that a later call goes on from there (with that
#: step's weights, ``steps[k]["after"]``) instead of replaying the steps before it again. The two are replaced
#: together, so a replay stopped midway leaves the entry as the last whole replay left it.
_CACHE: dict[tuple, dict[str, Any]] = {}


def one_process(opt: OptimizerStep) -> OptimizerStep:
    """``opt`` run on one process: every rank's micro-batches in rank order, normalised with dp_size 1 — the sum
    over micro-batches of all ranks then equals the gradient the ranks averaged (each rank's share is × dp_size)."""
    return dataclasses.replace(opt, shares=[opt.rows()], micro_batches=[[mb for rank in opt.micro_batches
                                                                         for mb in rank]], dp_size=1)


def tensor_names(models: Any, params: list[torch.nn.Parameter]) -> list[str]:
    """Readable names of ``params`` ("layers.0.self_attn.q_proj.lora_A", "value_head", …)."""
    by_id = {id(p): n for n, p in models.model.named_parameters()}
    for model, prefix in ((getattr(models, "critic_model", None), ""), (getattr(models, "value_head", None),
                                                                        "value_head.")):
        if model is not None:  # a full-fine-tuned critic is a model of its own; the value head a layer beside it
            by_id.update({id(p): prefix + n for n, p in model.named_parameters() if id(p) not in by_id})
    out = []
    for i, p in enumerate(params):
        name = by_id.get(id(p), f"param.{i}")
        name = re.sub(r"^(base_model\.model\.)?(model\.)?", "", name)
        out.append(re.sub(r"\.(actor|critic)(\.weight)?$", "", name).replace(".weight", ""))
    return out


def layer_of(name: str) -> str:
    """The layer a tensor belongs to ("layer 0", …), or its own name outside the layers."""
    m = re.search(r"layers\.(\d+)\.", name)
    return f"layer {m.group(1)}" if m else name


def step_batch(r: Run, step: int) -> Batch:
    """The recorded batch of ``step`` as the worker takes it (padding flags as bools, a row id per row)."""
    tensors = r.step(step).batch_tensors()
    tensors["is_pad"] = tensors["is_pad"].bool()
    if "row_id" not in tensors:
        tensors["row_id"] = torch.arange(tensors["responses"].shape[0])
    return Batch(tensors)


def step_effect(run: Run | str | os.PathLike | None = None, step: int = 1, opt_step: int = 0) -> dict[str, Any]:
    """What actor optimizer step ``opt_step`` of recorded step ``step`` did (module docstring). A replay measures
    every optimizer step up to ``opt_step`` on its way, each cached per run, step and optimizer step, and a later
    call for a later step goes on from where the last one stopped (its weights and Adam state): asked in turn for
    steps 0 … n−1, as lab 18 does, the update is replayed once, not 1 + 2 + … + n steps. Step 1
    starts from the seeded adapter; a later step from the state recorded with it (``trainer.record_update_state``),
    else :class:`RunLacks` (:func:`replayable_steps` lists the steps that can be replayed)."""
    r = resolve_run(run)
    step = whole_argument("step", step, None, "a recorded step's number")
    if step not in r.steps:  # (a run dir moved away says so here: Run.there)
        raise RunLacks(f"a recorded step {step} (recorded: {r.steps})", r)
    n = n_optimizer_steps(r, step)
    opt_step = whole_argument("opt_step", opt_step, range(n), f"an optimizer step of the actor's update at step {step}")
    key = cache_slot(_CACHE, r.identity(step))
    entry = _CACHE.setdefault(key, {"steps": {}, "worker": None})
    if opt_step not in entry["steps"]:
        _replay_update(r, step, opt_step, entry)
    return entry["steps"][opt_step]


def loss_terms(actor: Any) -> tuple[str, ...]:
    """The terms the actor config's loss holds, in ``algos.LOSS_TERMS`` order: pg always; the entropy bonus when
    entropy_coeff ≠ 0; the KL loss when use_kl_loss."""
    return tuple(t for t, on in zip(algos.LOSS_TERMS, (True, actor.entropy_coeff != 0, actor.use_kl_loss)) if on)


def replayable_steps(run: Run | str | os.PathLike | None = None) -> list[int]:
    """The recorded steps whose actor update can be replayed: step 1 (the seeded start a fresh trainer holds) and
    every step recorded with the actor's state before it (``trainer.record_update_state``) — those with an actor
    update."""
    r = resolve_run(run)
    return [k for k in r.steps if (k == 1 or "update_state" in r.step(k).info)  # the JSON says; no tensor is read
            and "actor_log_probs" in r.step(k).tensors]


def n_optimizer_steps(run: Run | str | os.PathLike | None = None, step: int = 1) -> int:
    """The actor's optimizer steps at recorded step ``step`` (its update plan)."""
    r = resolve_run(run)
    step = whole_argument("step", step, None, "a recorded step's number")
    return len(r.step(step).plan("actor").steps)


def _replay_update(r: Run, step: int, opt_step: int, entry: dict[str, Any]) -> None:
    """Replay optimizer steps of ``step`` through ``opt_step`` into ``entry`` (a :data:`_CACHE` entry): from the
    start of the update, or from the step after the last one measured (``entry["worker"]`` holds the optimizer's
    state there)."""
    import copy

    from ppolab.replay import REPLAY_LOCK, gradients, restore, run_models
    from ppolab.worker import ActorWorker

    if step not in r.steps:
        raise RunLacks(f"a recorded step {step} (recorded: {r.steps})", r)
    record = r.step(step)
    state = record.update_state()
    if state is None and step != 1:
        raise RunLacks(f"the actor's weights and Adam state before step {step} (only step 1 starts from the seeded "
                       "adapter a fresh trainer holds; train with trainer.record_update_state=true to keep them)", r)
    if "actor_log_probs" not in record.tensors:
        raise RunLacks(f"an actor update at step {step} (critic warm-up?)", r)
    cfg = r.ppo_config()
    plan = r.step(step).plan("actor")
    if not 0 <= opt_step < len(plan.steps):
        raise ValueError(f"opt_step={opt_step!r} is out of range; step {step} has optimizer steps 0 … "
                         f"{len(plan.steps) - 1}")
    steps = [one_process(o) for o in plan.steps]
    batch = step_batch(r, step)
    a = cfg.actor_rollout_ref.actor
    reading = InferBatching(len(batch))  # one forward over the step's rows (large vocabularies go a few rows a pass)
    with REPLAY_LOCK:
        models = run_models(r)
        params = models.actor_parameters()
        names = tensor_names(models, params)
        saved = [p.detach().clone() for p in params]
        worker = ActorWorker(a, models, temperature=cfg.actor_rollout_ref.rollout.temperature,
                             rollout_n=cfg.actor_rollout_ref.rollout.n)  # AdamW + warm-up, as the trainer built it
        try:
            done = entry["steps"]
            start = len(done)  # the steps measured so far are 0 … start − 1
            if start:  # where the last replay stopped: after step start − 1, its weights and Adam state
                restore(params, done[start - 1]["after"])
                # a copy: the optimizer takes the state's tensors as its own and steps them in place
                worker.load_state_dict(copy.deepcopy(entry["worker"]))
                lp_before = done[start - 1]["log_prob_after"]
            else:
                if state is not None:  # where the training stood before this step's update (record_update_state)
                    restore(params, [state["weights"][f"actor.{i}"] for i in range(len(params))])
                    worker.load_state_dict(state)
                lp_before = worker.infer(batch, reading)["log_probs"]
                if state is not None and not record.info["update_state"].get("digest"):
                    _check_state(record, plan, lp_before)  # recorded before digests: the log-prob agreement
            present = loss_terms(a)
            measured = {}  # cached below with the Adam state they end at, so an interrupted replay leaves no gap
            for k in range(start, opt_step + 1):  # the steps in the recorded order, each measured on the way
                before = [p.detach().clone() for p in params]
                terms = {}
                for term in present[1:]:  # the entropy bonus and the KL loss alone: a backward pass each
                    worker.terms = (term,)
                    _, loss = worker.backward_of(batch, steps[k])
                    terms[term] = {"loss": loss, "grads": gradients(params)}
                worker.terms = None
                metrics = worker.optimizer_step_of(batch, steps[k], params)  # the real step, Adam and all
                # what Adam consumed: the mini-batch gradient after the global-norm clip (verl: clip_grad)
                used = gradients(params)
                # pg: the step's gradient before the clip minus the other terms' (gradients add over the terms:
                # the loss is their sum) — a pass fewer than a backward of its own; pg is the large term, so the
                # difference loses no digits that matter (the small terms keep passes of their own)
                coef = _clip_coef(r, float(metrics["actor/grad_norm"]))
                others = [terms[t] for t in present[1:]]
                terms = {"pg": {"loss": float(metrics["actor/loss"]) - sum(o["loss"] for o in others),
                                "grads": [g / coef - sum(o["grads"][i] for o in others) for i, g in enumerate(used)]},
                         **terms}
                after = [p.detach().clone() for p in params]
                lp_after = worker.infer(batch, reading)["log_probs"]
                lr = float(worker.optimizer.param_groups[0]["lr"])
                measured[k] = _measure(r, step, k, plan, batch, names, before, after, used, terms, lp_before,
                                       lp_after, lr, metrics)
                measured[k]["adam"] = adamw_step_parts(worker.optimizer, params, used, before,
                                                       stepped=math.isfinite(float(metrics["actor/grad_norm"])))
                lp_before = lp_after
            # one call replaces both, so an interruption lands before it or after it, never between them
            entry.update(steps={**done, **measured}, worker=copy.deepcopy(worker.state_dict()))
        finally:
            worker.terms = None
            restore(params, saved)


#: How far a recorded update state's log-probs may sit from those its step's first optimizer step recorded: 0 on
#: the machine that trained it (fp32; measured on a 3-step tiny run), float rounding elsewhere; the next step's
#: state spliced in sat 1.6 away there. Used only for records without a digest (before ``update_state_record``
#: kept one).
STATE_TOLERANCE = 1e-4


def _check_state(record, plan, lp_before: torch.Tensor) -> None:
    """For a step recorded before update states carried a digest (``record.update_state_record``): the state's
    weights must compute on optimizer step 0's rows the log-probs the training's forward recorded there
    (``actor_log_probs[0]``) — a sound record agrees with its own step to float rounding; else a
    :class:`ppolab.errors.FileFormatError` naming the file."""
    from ppolab.errors import FileFormatError

    seen = record.tensors["actor_log_probs"][0].float()
    rows = torch.as_tensor(plan.steps[0].rows(), dtype=torch.long)
    mask = ~torch.isnan(seen[rows]) & (record.tensors["response_mask"][rows] > 0)
    if not bool(mask.any()):
        return
    gap = float((lp_before[rows].float()[mask] - seen[rows][mask]).abs().max())
    if gap > STATE_TOLERANCE:
        where = record.files[0] if record.files else f"the tensors of step {record.step}"
        raise FileFormatError(f"{where}: its update state (the actor's weights before step {record.step}) computes "
                              f"log-probs up to {gap:.3g} from those the step's first optimizer step recorded "
                              f"(actor_log_probs[0]; a sound record agrees to float rounding): copied in from "
                              f"another step or damaged — put back the step's own file, or re-record the run")


def _measure(r, step, opt_step, plan, batch, names, before, after, used, terms, lp_before, lp_after, lr,
             metrics) -> dict[str, Any]:
    """The numbers of one replayed optimizer step (token side and parameter side)."""
    t = batch.tensors
    real = ~t["is_pad"]
    mask = t["response_mask"].float() * real.float().unsqueeze(-1)
    rows = torch.as_tensor(plan.steps[opt_step].rows(), dtype=torch.long)
    in_mini = torch.zeros(len(batch), dtype=torch.bool)
    in_mini[rows] = True
    delta = torch.where(mask > 0, lp_after - lp_before, torch.full_like(lp_before, float("nan")))
    token = _token_side(r, plan.steps[opt_step], t, lp_before, mask, rows)
    params = tensor_steps(names, before, after, used, lr)
    term_norms = {k: [float(g.norm()) for g in v["grads"]] for k, v in terms.items()}
    flat = {k: torch.cat([g.flatten() for g in v["grads"]]) for k, v in terms.items()}
    cosines = {}
    for i, x in enumerate(flat):
        for y in list(flat)[i + 1:]:
            nx, ny = float(flat[x].norm()), float(flat[y].norm())
            cosines[(x, y)] = float(torch.dot(flat[x], flat[y]) / (nx * ny)) if nx > 0 and ny > 0 else float("nan")
    raw_norm = float(metrics["actor/grad_norm"])  # before the clip: Σ of the terms' gradients has this norm
    return {
        "step": step, "opt_step": opt_step, "n_opt": len(plan.steps), "plan_recorded": plan.recorded,
        "epoch": plan.steps[opt_step].epoch, "mini_batch": plan.steps[opt_step].mini_batch,
        "rows": rows.tolist(), "in_mini_batch": in_mini, "mask": mask,
        "log_prob_before": lp_before, "log_prob_after": lp_after, "delta": delta, **token,
        "names": names, "params": params, "grads": used, "before": before, "after": after,
        "update": [a_ - b for a_, b in zip(after, before)],
        "clip_coef": _clip_coef(r, raw_norm),
        "terms": {k: v["grads"] for k, v in terms.items()}, "term_losses": {k: v["loss"] for k, v in terms.items()},
        "term_norms": term_norms, "term_cosines": cosines,
        "grad_norm": raw_norm, "loss": float(metrics["actor/loss"]), "lr": lr, "metrics": metrics,
    }


def adamw_step_parts(optimizer: torch.optim.AdamW, params: list[torch.nn.Parameter], grads: list[torch.Tensor],
                     before: list[torch.Tensor], stepped: bool = True) -> dict[str, list[torch.Tensor]]:
    """The step ``optimizer`` (torch's AdamW, just stepped) took, split exactly into three parts per tensor:

        Δθ = decay + momentum + gain ⊙ g
        decay    = −lr·wd·θ                        (θ before the step: AdamW decays first)
        momentum = −(lr/bc₁)·β₁·m_{t−1} / d         (the earlier steps' gradients Adam still carries)
        gain     = −(lr/bc₁)·(1 − β₁) / d            (what one unit of this step's gradient moves an entry by)

    with m_t = β₁m_{t−1} + (1 − β₁)g and v_t Adam's moments after step t, bc₁ = 1 − β₁ᵗ, bc₂ = 1 − β₂ᵗ,
    d = √(v_t / bc₂) + ε, and g (``grads``) the gradient AdamW consumed (after the global-norm clip). ``gain`` is
    negative: the step runs against the gradient, entry by entry scaled by 1/d (lab 18's first-order account of a
    token's move, :mod:`ppolab.numbers.token_moves`). A step skipped for a non-finite gradient norm
    (``stepped=False``) and a tensor AdamW did not step are all zeros."""
    parts: dict[str, list[torch.Tensor]] = {"decay": [], "momentum": [], "gain": []}
    group = optimizer.param_groups[0]
    lr, (b1, b2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
    for p, g, theta in zip(params, grads, before):
        state = optimizer.state.get(p, {})
        if not stepped or "exp_avg" not in state:
            for key in parts:
                parts[key].append(torch.zeros_like(theta))
            continue
        t = float(state["step"])
        bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
        d = (state["exp_avg_sq"].detach().sqrt() / math.sqrt(bc2)).add_(eps)
        parts["decay"].append(-lr * wd * theta)
        parts["momentum"].append(-(lr / bc1) * (state["exp_avg"].detach() - (1 - b1) * g) / d)
        parts["gain"].append(-(lr / bc1) * (1 - b1) / d)
    return parts


def tensor_steps(names: list[str], before: list[torch.Tensor], after: list[torch.Tensor], used: list[torch.Tensor],
                 lr: float) -> list[dict[str, Any]]:
    """Per trainable tensor of one optimizer step: ‖gradient‖ (what the optimizer consumed), ‖Δθ‖, the step plain
    SGD would take (lr·‖g‖), cos(Δθ, −g) and ‖θ‖ before — the actor's and the critic's replays alike."""
    out = []
    for name, b, a, g in zip(names, before, after, used):
        d = a - b
        gn, dn = float(g.norm()), float(d.norm())
        cos = float(torch.dot(d.flatten(), -g.flatten()) / (dn * gn)) if gn > 0 and dn > 0 else float("nan")
        out.append({"name": name, "shape": tuple(g.shape), "grad_norm": gn, "delta_norm": dn,
                    "sgd_step_norm": lr * gn, "cos_update_neg_grad": cos, "before_norm": float(b.norm())})
    return out


def _clip_coef(r: Run, grad_norm: float) -> float:
    """The factor the global-norm clip multiplied the gradients by (torch ``clip_grad_norm_``: max_norm /
    (norm + 1e-6), at most 1)."""
    clip = r.ppo_config().actor_rollout_ref.actor.optim.clip_grad
    return min(1.0, clip / (grad_norm + 1e-6))


def _token_side(r: Run, opt: OptimizerStep, t: dict, lp_before: torch.Tensor, mask: torch.Tensor,
                rows: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per token of the step's rows: ratio, clip state, advantage, and the policy-gradient coefficient
    ∂ pg_loss / ∂ log π — computed with the run's own loss function and the step's global counts."""
    cfg = r.ppo_config().actor_rollout_ref.actor
    eps_low, eps_high = clip_bounds(cfg)
    old = t["old_log_probs"].float()
    adv = t["advantages"].float()
    terms = algos.ppo_clip_terms(old, lp_before, adv, eps_low, eps_high, cfg.get("clip_ratio_c", 3.0))
    state = torch.zeros_like(adv, dtype=torch.long)
    clipped = terms["clipped"] > 0
    state[clipped & (adv > 0)] = 1
    state[clipped & (adv < 0)] = 2
    state[terms["dual_clipped"] > 0] = 3
    outside = torch.ones(adv.shape[0], dtype=torch.bool)
    outside[rows] = False
    state[outside] = -2  # not trained by this optimizer step: no clip applies
    state[mask == 0] = -1
    loss = algos.get_policy_loss_fn(cfg.policy_loss.loss_mode)
    weights = t.get("rollout_is_weights")
    info = dataclasses.replace(opt.info(), dp_size=1)
    attended = t.get("response_attention_mask", t["response_mask"])
    coefficient, pg_total = torch.zeros_like(adv), 0.0
    for mb in one_process(opt).micro_batches[0]:  # as the worker cuts it: each micro-batch at its own width
        idx = torch.as_tensor(mb, dtype=torch.long)
        width = max(int(attended[idx].sum(-1).max()), 1)
        lp = lp_before[idx, :width].clone().requires_grad_(True)
        pg, _ = loss(old[idx, :width], lp, adv[idx, :width], mask[idx, :width], cfg.loss_agg_mode, cfg,
                     None if weights is None else weights[idx, :width].float(), global_batch_info=info)
        pg.backward()
        coefficient[idx, :width] = lp.grad.detach()
        pg_total += float(pg.detach())
    return {"ratio": terms["ratio"], "clip_state": state, "advantages": adv, "coefficient": coefficient,
            "pg_loss": pg_total}


def clip_state_name(code: int) -> str:
    """The name of a ``clip_state`` code."""
    return {-1: "masked", -2: "not in this mini-batch"}.get(code) or CLIP_STATES[code]
