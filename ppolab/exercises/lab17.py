"""Lab 17 — the capstone: one recorded training step rebuilt from its tensors without ``ppolab.algos`` (chapter §1–§15).

Every part of part I is code written as a function of its settings: at the run's own settings the lab compares it
with what the run logged for that step in ``metrics.jsonl`` (a self-check), and the graded answer is the same code at
settings the run did not train with (``ppolab.numbers.capstone_what_if``), whose truth ``ppolab.algos`` computes as
the trainer calls it — no logged or printed number answers a part. Recorded data: ``ppo_fire_tiny`` (2 ranks,
adaptive reward KL, rejection sampling, padding rows, clip and dual clip), or any run.
"""
from __future__ import annotations

from ppolab.exercises import exercise
from ppolab.numbers import capstone, capstone_what_if

RUN = capstone.SHIPPED
TOL = dict(rel=capstone.REL, abs=capstone.ABS)


def step_case(run=None) -> dict:
    """The capstone's recorded step (:func:`ppolab.numbers.capstone.capstone_step`)."""
    return {"step": capstone.capstone_step(run)}


def opt_case(run=None) -> dict:
    """The capstone's step and the optimizer step where the dual clip (else the clip) bites most."""
    return capstone.actor_case(run)


def _truth(part: str, run=None) -> dict[str, float]:
    return capstone_what_if.truth(part, run)


def _what_if_case(part: str):
    def case(run=None) -> dict:
        return {**(opt_case(run) if part == "17.4" else step_case(run)),
                "what_if": capstone_what_if.what_if_text(part, run)}
    case.__name__ = f"what_if_case_{part.replace('.', '_')}"
    return case


@exercise("17.1", "Recorded step {step}: the reward-side KL, as a function of the estimator and the controller. "
                  "β of this step from the previous step's logged β and KL (the adaptive controller; kl_coef for a "
                  "fixed one, and at step 1), kld = the estimator × the mask before rejection, token_level_rewards "
                  "= scores − β·kld. Check it against the log at the run's settings, then answer it at {what_if} "
                  "(settings the run did not train with) as the dict {'actor/reward_kl_penalty_coeff': β, "
                  "'actor/reward_kl_penalty': the batch KL, 'critic/rewards/mean': mean over the real rows of "
                  "Σ_t rewards}.",
          hints=("β is read before this step's update: it is the previous step's β after the controller saw the "
                 "previous step's KL. The KL of a step is the mean over every row — padding rows too — of each row's "
                 "token mean of kld under loss_mask (rejection rewrites response_mask only later, in the same stage).",
                 "β_s = β_{s−1}·(1 + clip(KL_{s−1}/target − 1, −0.2, 0.2)·N/horizon), N = rows of the batch "
                 "(padding rows too); KL_s = mean_i(Σ_t kld·m / Σ_t m) with m = loss_mask; rewards/mean = "
                 "mean over real rows of Σ_t (score − β·kld); kl = k1 = old − ref, low_var_kl = k3 = "
                 "clamp(e^x − x − 1, ±10) with x = clamp(ref − old, ±20) (verl `ray_trainer.py::apply_kl_penalty`, "
                 "`core_algos.py::kl_penalty`)."),
          context=("run",), needs=("kl_in_reward",), case=_what_if_case("17.1"), default_run=RUN,
          kind="compute", **TOL)
def _e1(run=None) -> dict:
    return _truth("17.1", run)


@exercise("17.2", "Recorded step {step}: rejection sampling (rollout_rs), as a function of the options and "
                  "thresholds. From old_log_probs, rollout_log_probs and loss_mask, find which tokens they reject; "
                  "check it against the log (and the recorded response_mask) at the run's settings, then answer it "
                  "at {what_if} as {'rollout_corr/rollout_rs_masked_fraction': rejected share of the valid tokens, "
                  "'rollout_corr/rollout_rs_seq_masked_fraction': share of rows with a rejected token}.",
          hints=("lr = clamp(old − rollout, ±20); k1 = −lr, k2 = ½·lr², k3 = e^lr − 1 − lr. A token_* option tests "
                 "each token, a seq_* option reduces over the row's valid tokens and keeps or drops the whole row; "
                 "every option must pass. loss_mask × keep must equal the recorded response_mask.",
                 "k1 options keep log(lower) ≤ stat ≤ log(upper) (one number u means lower = 1/u), the others "
                 "stat ≤ upper; masked_fraction = masked_mean(1 − keep, loss_mask); seq_masked_fraction = rows with a "
                 "rejected valid token / all rows, padding rows too (verl "
                 "`rollout_corr_helper.py::compute_rollout_rejection_mask`)."),
          context=("run",), needs=("rejection",), case=_what_if_case("17.2"), default_run=RUN,
          kind="compute", **TOL)
def _e2(run=None) -> dict:
    return _truth("17.2", run)


@exercise("17.3", "Recorded step {step}: GAE and whitening, as a function of γ and λ. From token_level_rewards, "
                  "values and response_mask (after rejection), compute the advantages and returns; check them "
                  "against the log at the run's γ and λ, then answer at {what_if} the six statistics "
                  "critic/advantages/{mean,max,min} and critic/returns/{mean,max,min} over the real rows' valid "
                  "tokens.",
          hints=("Run backwards over t; a masked position passes V_next and the running GAE through unchanged. "
                 "Returns are taken before whitening; the advantages are then whitened over the whole batch.",
                 "δ_t = r_t + γ·V_next − V_t; A_t = δ_t + γλ·A_{t+1}; returns = A + V; A ← (A − mean)·rsqrt(var + "
                 "1e-8) with mean and unbiased var over response_mask (verl `core_algos.py::"
                 "compute_gae_advantage_return`)."),
          context=("run",), needs=("critic",), case=_what_if_case("17.3"), default_run=RUN,
          kind="compute", **TOL)
def _e3(run=None) -> dict:
    return _truth("17.3", run)


@exercise("17.4", "Recorded step {step}, optimizer step {opt_step}: the actor's loss on {dp} rank(s), as a function "
                  "of the clip window and the dual-clip bound. For each rank's micro-batches "
                  "(capstone.micro_batch_rows) compute ratio, clip, dual clip and the KL loss, aggregated over the "
                  "global counts × dp_size; check it against that optimizer step's rebuild at the run's settings, then "
                  "answer at {what_if} the dict of actor/pg_loss, actor/pg_clipfrac, actor/pg_clipfrac_lower, "
                  "actor/ppo_kl (and actor/kl_loss when the run has a KL loss, actor/entropy_loss when it recorded "
                  "π_θ's entropy, actor_entropy).",
          hints=("Losses: each micro-batch divides its masked sum by the token count of the whole global mini-batch "
                 "(all ranks, loss_mask) and multiplies by dp_size; a rank sums its micro-batches. Fractions: a plain "
                 "mean over micro-batches. Then the mean over ranks.",
                 "r = exp(clamp(lp − old, ±20)); L = max(−A·r, −A·clip(r, 1−ε, 1+ε)), and where A < 0 min(L, −A·c); "
                 "pg_clipfrac = mean[(−A·clip(r)) > (−A·r)]; pg_clipfrac_lower = mean[L_clip > −A·c and A < 0]; "
                 "ppo_kl = mean(old − lp); kl_loss = agg(k3(lp, ref)); entropy_loss = agg(actor_entropy[k]); agg "
                 "token-mean = Σ x·m / global Σ loss_mask × dp, seq-mean-token-mean = Σ over rows with a valid token "
                 "of each row's token mean / global mini-batch rows × dp (verl `core_algos.py::"
                 "compute_policy_loss_vanilla`, `agg_loss`, `losses.py::ppo_loss`)."),
          context=("run",), needs=("vanilla_loss",), case=_what_if_case("17.4"), default_run=RUN, kind="compute",
          **TOL)
def _e4(run=None) -> dict:
    return _truth("17.4", run)


@exercise("17.5", "Recorded step {step}: every optimizer step of the actor, reduced as the trainer logs them. Check "
                  "your reduction of 17.4's function against the log at the run's settings, then answer at "
                  "{what_if} the dict of actor/pg_loss, actor/pg_clipfrac, actor/pg_clipfrac_lower, actor/ppo_kl "
                  "(and actor/kl_loss when the run has a KL loss, actor/entropy_loss when it recorded "
                  "actor_entropy).",
          hints=("Each optimizer step gives one value per metric (17.4); the logged value of the training step "
                 "reduces those over all mini-batches and epochs.",
                 "reduce_metrics: np.mean over the optimizer steps (np.max / np.min only for keys naming max / min) "
                 "— after the sum over micro-batches (losses) or mean (fractions) and the mean over ranks (verl "
                 "`metric_utils.py::reduce_metrics`)."),
          context=("run",), needs=("update_entropy", "vanilla_loss"), case=_what_if_case("17.5"), default_run=RUN,
          kind="compute", **TOL)
def _e5(run=None) -> dict:
    return _truth("17.5", run)


@exercise("17.6", "Recorded step {step}: every critic update, as a function of ε_v. From "
                  "critic_vpreds (one per critic optimizer step), values, returns and response_mask, compute the "
                  "clipped value loss; check it against the log at the run's settings, then answer at {what_if} the "
                  "dict {'critic/vf_loss': …, 'critic/vf_clipfrac': …, 'critic/vpred_mean': …}.",
          hints=("The critic has its own mini-batches (critic.ppo_mini_batch_size, critic.ppo_epochs) and "
                 "micro-batches (capstone.micro_batch_rows(run, step, 'critic')); its loss is normalised like the "
                 "actor's.",
                 "V_clip = clip(V_new, V_old ± ε_v); vf_loss = ½·Σ max((V_new − G)², (V_clip − G)²)·m / global Σ "
                 "loss_mask × dp_size, summed over micro-batches; vf_clipfrac = mean[(V_clip − G)² > (V_new − G)²]; "
                 "vpred_mean = masked mean of V_new; then means over ranks and optimizer steps; seq-mean-token-mean "
                 "aggregates as the actor's does (verl `core_algos.py::compute_value_loss`, `agg_loss`)."),
          context=("run",), needs=("critic",), case=_what_if_case("17.6"), default_run=RUN,
          kind="compute", **TOL)
def _e6(run=None) -> dict:
    return _truth("17.6", run)


@exercise("17.7", "Recorded step {step}: the step's total losses, from your own numbers of 17.5 and 17.6. Check "
                  "them against the log at the run's settings, then answer {'actor/loss': …} (and 'critic/loss' "
                  "when the run has a critic) at 17.5's and 17.6's what-if settings.",
          hints=("actor/loss is the sum of the micro-batch losses, each pg − entropy bonus + KL loss, reduced like "
                 "pg_loss; every reduction on the way is linear. Which entropy is π_θ's: actor_entropy or the "
                 "stage-4 entropy behind actor/entropy?",
                 "actor/loss = pg_loss − entropy_coeff·entropy_loss + kl_loss_coef·kl_loss, with entropy_loss from "
                 "actor_entropy (17.5; actor/entropy is π_old's, from stage 4); critic/loss = vf_loss (verl "
                 "`losses.py::ppo_loss`)."),
          context=("run",), needs=("update_entropy", "vanilla_loss"), case=step_case, default_run=RUN,
          kind="compute", **TOL)
def _e7(run=None) -> dict:
    return _truth("17.7", run)


def backprop_case(run=None) -> dict:
    """17.8's tensor: the last LoRA B (else the last trainable tensor) of the actor, at optimizer step 0 of recorded
    step 1 — where the weights are the seeded adapter a fresh trainer holds, so the replay is the run's own step."""
    from ppolab.numbers.update_effect import step_effect
    from ppolab.run.reader import resolve_run

    names = step_effect(resolve_run(run, RUN), 1, 0)["names"]
    i = max((i for i, n in enumerate(names) if n.endswith("lora_B")), default=len(names) - 1)
    return {"index": i, "name": names[i]}


@exercise("17.8", "One step further — backpropagate your loss. Recorded step 1, optimizer step 0 (the seeded adapter: "
                  "ppolab.replay.run_models(run) holds exactly those weights). Run the actor forward with gradients "
                  "on each micro-batch of that optimizer step, feed its log-probs to your 17.4 policy loss (the pg "
                  "term only: ratio, clip, dual clip, token-mean over the global Σ loss_mask), backward, and answer "
                  "the gradient that reached {name} (tensor {index} of models.actor_parameters()): its .grad, a "
                  "tensor.",
          hints=("Nothing changes in your loss but its inputs: log π now comes from forward_response(model, …) with a "
                 "graph instead of the recorded actor_log_probs, so backward reaches the LoRA matrices. Sum the "
                 "micro-batch losses' gradients (call backward on each); the denominator is the whole mini-batch's.",
                 "for each micro-batch of recorded_plan(run.step(1), run.ppo_config()).steps[0]: ids, mask, R = "
                 "trimmed_inputs(batch.select(rows)); with models.actor() as m: lp = forward_response(m, ids, mask, R, "
                 "temperature, True, False).log_probs; your_pg_loss(lp, …).backward(); then "
                 "models.actor_parameters()[{index}].grad.clone() — and set every .grad to None before you start."),
          rel=1e-3, abs=1e-6, context=("run",), needs=("step1", "vanilla_loss"), case=backprop_case, default_run=RUN,
          kind="compute")
def _e8(run=None):
    from ppolab.numbers.update_effect import step_effect
    from ppolab.run.reader import resolve_run

    r = resolve_run(run, RUN)
    # the pg term's gradient of the worker's own backward (ppolab.numbers.update_effect: a pass of its own)
    return step_effect(r, 1, 0)["terms"]["pg"][backprop_case(r)["index"]]
