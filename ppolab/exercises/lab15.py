"""Lab 15 — reading the training metrics (chapter §15): distributions per step, the warning signs, the KL term."""
from __future__ import annotations

import pandas as pd
import torch

from ppolab import algos
from ppolab.exercises import exercise

#: Made-up numbers from the second half of a run (exercise 15.3). Not a real run.
SNIPPET = pd.DataFrame({
    "actor/pg_clipfrac": [0.04, 0.05, 0.04, 0.05, 0.06, 0.05, 0.04, 0.05],
    "actor/ppo_kl": [0.004, 0.003, 0.005, 0.004, 0.003, 0.004, 0.005, 0.004],
    "actor/entropy": [0.62, 0.55, 0.41, 0.30, 0.17, 0.08, 0.04, 0.02],
    "actor/grad_norm": [0.9, 1.1, 1.0, 1.2, 0.8, 1.1, 0.9, 1.0],
}, index=pd.Index(range(51, 59), name="step"))


def _last_step(run=None) -> dict:
    """Exercise 15.1's recorded step: the run's last."""
    from ppolab.numbers import resolve_run

    return {"step": resolve_run(run).steps[-1]}


@exercise("15.1", "Predict, then verify: at the run's last recorded step, what share of the real trajectories has "
                  "an advantage of exactly 0 on every response token? (3 decimals)",
          kind="predict",
          hints=("In GRPO a trajectory's advantage is (score − group mean) / (group std + ε). When is the "
                 "numerator exactly 0 for every member of a group? Look at the score shares per group, or the spike "
                 "at 0 of the advantage boxes.",
                 "share = mean over real rows of all(advantages[row][response_mask[row] == 1] == 0), rows with at "
                 "least one response token; for GRPO = 8 × (number of groups whose 8 scores are equal) / 128."),
          rel=0.0, abs=5e-4, context=("run",), case=_last_step)
def _e1(run=None) -> float:
    from ppolab.numbers import real_rows, resolve_run

    r = resolve_run(run)
    rec = r.step(r.steps[-1])
    t = rec.tensors
    real = real_rows(rec) & (t["response_mask"].sum(-1) > 0)
    zero = ((t["advantages"] != 0) & t["response_mask"].bool()).sum(-1) == 0
    return float(zero[real].float().mean())


@exercise("15.2", "The top of GRPO's advantage distribution, and how it depends on the group size: a group of 5 "
                  "(rollout.n = 5, not the shipped run's 8) in which exactly one answer scores 1 and four score 0. "
                  "What advantage does the right answer get (norm_adv_by_std_in_grpo = true, ε = 1e-6, torch's default "
                  "unbiased std)? (4 decimals)",
          kind="compute",
          hints=("Group mean 1/5; the numerator is 1 − 1/5. The std is torch.std of the five scores: the unbiased "
                 "one, dividing by n − 1.",
                 "A = (1 − 1/5) / (std([1, 0, 0, 0, 0]) + 1e-6) — compute_grpo_outcome_advantage on that "
                 "group, the first row."),
          rel=0.0, abs=5e-5)
def _e2() -> float:
    scores = torch.zeros(5, 1, dtype=torch.float64)
    scores[0, 0] = 1.0
    adv, _ = algos.compute_grpo_outcome_advantage(scores, torch.ones_like(scores), [0] * 5, epsilon=1e-6,
                                                  norm_adv_by_std_in_grpo=True)
    return float(adv[0, 0])


@exercise("15.3", "A colleague sends made-up numbers from the second half of a run (ppolab.exercises.lab15.SNIPPET). "
                  "Which warning fires? Answer the metric its warning_signs line is about — the line's first word, "
                  "e.g. \"actor/ppo_kl\" (the same in every language the lines are shown in).",
          kind="compute",
          hints=("Compare the first and the last values of each column: which metric changes by an order of "
                 "magnitude, and what does the chapter call that?",
                 "warning_signs(snippet): the entropy check compares the mean of the last 10 % with the first 10 % "
                 "(ratio below THRESHOLDS['entropy_collapse_ratio']); answer the metric it names."),
          context=("frame",))
def _e3(frame=None) -> str:
    from ppolab.numbers.metrics import warning_signs

    found = warning_signs(SNIPPET if frame is None else frame)
    return found[0].split(" ")[0] if len(found) == 1 else f"{len(found)} warnings"


def kl_case(run=None) -> dict:
    """Exercise 15.4's recorded steps: the second half of them, from ``step`` to ``last``."""
    from ppolab.run.reader import resolve_run

    from ppolab.numbers import RunLacks

    r = resolve_run(run)
    steps = r.steps
    case = {"step": steps[len(steps) // 2], "last": steps[-1]}
    if all(first_update_terms(r, s)["actor/pg_loss"] == 0 for s in steps[len(steps) // 2:]):
        # every advantage 0 (no learning signal yet): there is no policy loss to compare the KL term with
        raise RunLacks("a policy loss ≠ 0 at the first optimizer step of the second half's recorded steps "
                       "(an advantage ≠ 0)", r)
    return case


def first_update_terms(run=None, step: int | None = None) -> dict[str, float]:
    """ppo_loss's metrics at optimizer step 0 of recorded ``step`` (π_θ = π_old there), with the run's config: the
    terms the loss adds up, each aggregated as the run aggregates it."""
    from ppolab.numbers import actor_config, optimizer_step_batch, resolve_run

    r = resolve_run(run)
    b = optimizer_step_batch(r.step(r.steps[-1] if step is None else step), 0)
    _, metrics = algos.ppo_loss(actor_config(r), old_log_prob=b["old_log_probs"], log_prob=b["log_prob"],
                                advantages=b["advantages"], response_mask=b["response_mask"],
                                ref_log_prob=b["ref_log_prob"])
    return metrics


@exercise("15.4", "Is the reference KL driving the update? For each recorded step from {step} to {last} (the second "
                  "half of the recorded steps), take its first optimizer step (π_θ = π_old there, every ratio 1) and "
                  "compute from the tensors the loss-side KL term kl_loss_coef · kl_loss (the run's kl_loss_type, "
                  "old_log_probs against ref_log_prob) and |pg_loss|, each aggregated as the run's loss_agg_mode does. "
                  "Answer median(kl_loss_coef · kl_loss) / median(|pg_loss|) over those steps.",
          kind="compute",
          hints=("The raw kl_loss is not what the loss adds: multiply by kl_loss_coef first, then compare with the "
                 "size of pg_loss (its absolute value; at ratio 1 each token's policy loss is −A). A median per term "
                 "over the steps, then the ratio.",
                 "for s in run.steps[len(run.steps) // 2:]: b = optimizer_step_batch(run.step(s), 0); _, m = "
                 "ppo_loss(actor_config(run), old_log_prob=b['old_log_probs'], log_prob=b['log_prob'], "
                 "advantages=b['advantages'], response_mask=b['response_mask'], ref_log_prob=b['ref_log_prob']); "
                 "collect kl_loss_coef · m['actor/kl_loss'] and abs(m['actor/pg_loss']); answer the ratio of the "
                 "two medians (statistics.median: of an even count, the mean of the two middle values)."),
          rel=1e-4, abs=1e-9, context=("run",), needs=("kl_loss", "reference"), case=kl_case)
def _e4(run=None) -> float:
    from ppolab.numbers import actor_config, resolve_run

    r = resolve_run(run)
    steps = [s for s in r.steps if s >= kl_case(r)["step"]]
    terms = [first_update_terms(r, s) for s in steps]
    coef = actor_config(r).kl_loss_coef
    kl = pd.Series([coef * m["actor/kl_loss"] for m in terms]).median()
    pg = pd.Series([abs(m["actor/pg_loss"]) for m in terms]).median()
    return float(kl / pg)


#: Exercise 15.5's run: one whose update computes the entropy (entropy_coeff ≠ 0), with rejection sampling.
ENTROPY_RUN = "ppo_fire_tiny"


def entropy_as_the_update_sees_it(run=None, step: int | None = None) -> float:
    """π_old's stage-4 entropy aggregated as the update aggregates ``actor/entropy_loss``: per optimizer step, the
    global mini-batch's Σ response_mask·H over its batch_num_tokens = Σ loss_mask (token-mean; other modes through
    ``agg_loss`` with the trainer's global counts), then the mean over the optimizer steps (``reduce_metrics``)."""
    from ppolab.numbers import actor_config, optimizer_step_batch, resolve_run

    r = resolve_run(run, default=ENTROPY_RUN)
    rec = r.step(r.steps[0] if step is None else step)
    t, cfg = rec.tensors, actor_config(r)
    values = []
    for k in range(len(rec.plan("actor").steps)):
        b = optimizer_step_batch(rec, k)
        info = rec.opt_step(k).step.info()  # the global counts the update divided by (its plan)
        values.append(float(algos.agg_loss(t["entropy"][b["rows"]], b["response_mask"], cfg.loss_agg_mode,
                                           batch_num_tokens=info.batch_num_tokens,
                                           global_batch_size=info.global_batch_size,
                                           loss_scale_factor=info.loss_scale_factor)))
    return sum(values) / len(values)


@exercise("15.5", "Predict, then verify — two entropies (§15): at the run's first recorded step, actor/entropy is "
                  "π_old's entropy from stage 4 over the whole batch and the mask as generated; actor/entropy_loss "
                  "is π_θ's, inside the update. What would actor/entropy_loss be if π_θ were still π_old? Aggregate "
                  "the recorded stage-4 entropy as the update does (4 significant digits).",
          kind="predict",
          hints=("The update sees one global mini-batch per optimizer step, masks with response_mask as it is after "
                 "rejection sampling, divides by batch_num_tokens = Σ loss_mask (which still counts the rejected "
                 "tokens), and the logged value is the mean over the optimizer steps.",
                 "mean over k of Σ(entropy·response_mask) / Σ loss_mask over the rows of optimizer_step_batch(rec, "
                 "k) — agg_loss(entropy[rows], response_mask, loss_agg_mode, batch_num_tokens=Σ loss_mask[rows])."),
          rel=1e-3, abs=1e-9, context=("run",), needs=("opt_steps",), default_run=ENTROPY_RUN)
def _e5(run=None) -> float:
    return entropy_as_the_update_sees_it(run)


#: Exercises 15.6–15.7's knobs (ppolab.experiments.ablations.KNOBS): the policy's and the regularisers'.
POLICY_KNOBS = ("clip_ratio", "ppo_epochs", "loss_agg_mode", "bypass_mode")
REGULARISER_KNOBS = ("kl_loss_coef", "kl_path", "entropy_coeff", "temperature")


def _knobs_case(knobs: tuple[str, ...]):
    def case(run=None) -> dict:
        """The knobs ``run`` (the base the lab passes as ``base``; default the shipped grpo_tiny) can take."""
        from ppolab.experiments import ablations

        r = run if run is not None else "grpo_tiny"
        return {"knobs": ", ".join(f"{k} ({ablations.knob_label(r, k)}: {ablations.KNOBS[k].metric})"
                                   for k in knobs if ablations.applies(r, k)),
                "steps": ablations.STEPS, "n_seeds": ablations.N_SEEDS}
    return case


def _verdicts(base, knobs):
    """The verdicts of ``knobs`` on ``base``'s short runs (default the shipped grpo_tiny's): a check on another run
    trains its short runs only when the lab passes that run as ``base``, never as the lab's ``run``."""
    from ppolab.experiments import ablations

    return ablations.verdicts(base if base is not None else "grpo_tiny", knobs)  # it leaves out what the run lacks


_PREDICT = ("Predict the curve: short runs of {steps} steps, each the base run with one knob changed — {knobs} — "
            "each pair trained on {n_seeds} seeds (under one seed the two share the first rollouts). For each knob, "
            "take on every seed the mean of its metric over steps 2–{steps} with the knob minus its base's: is it "
            "'up' (above 0 on every seed, and their mean larger than their spread), 'down' (likewise below 0) or "
            "'flat' (anything else)? A dict {knob: 'up' | 'down' | 'flat'}; a wrong try names the knobs that are "
            "off.")


@exercise("15.6", _PREDICT,
          kind="predict",
          hints=("Read each mechanism, not the log: a narrower clip binds on more tokens; more epochs move π_θ further "
                 "from π_old before the next rollout; seq-mean-token-sum sums each response's tokens instead of "
                 "averaging them; and bypass measures the update against π_rollout — computed by another engine or "
                 "dtype than the trainer's — instead of π_old: how far apart are the two here?",
                 "d = [mean(curve(knob run)[1:]) − mean(curve(its base)[1:]) for each seed] — "
                 "ppolab.experiments.ablations.ablation_runs(run) trains (or reads) the short runs; the figure after "
                 "the exercise draws each seed's difference."),
          context=("base",), case=_knobs_case(POLICY_KNOBS))
def _e6(base=None) -> dict[str, str]:
    return _verdicts(base, POLICY_KNOBS)


@exercise("15.7", _PREDICT,
          kind="predict",
          hints=("Which way does each regulariser pull: a larger KL coefficient toward π_ref, an entropy bonus toward "
                 "a flatter π? KL moved into the reward is subtracted from what critic/rewards/mean sums. And which "
                 "entropy does actor/entropy log — π_old at the rollout temperature?",
                 "d = [mean(curve(knob run)[1:]) − mean(curve(its base)[1:]) for each seed] — "
                 "ppolab.experiments.ablations.ablation_runs(run); the figure after the exercise draws each seed's "
                 "difference."),
          context=("base",), case=_knobs_case(REGULARISER_KNOBS))
def _e7(base=None) -> dict[str, str]:
    return _verdicts(base, REGULARISER_KNOBS)
