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


@exercise("15.1", "Predict, then verify: at the run's last recorded step, what share of the real trajectories has "
                  "an advantage of exactly 0 on every response token? (3 decimals)",
          hints=("In GRPO a trajectory's advantage is (score − group mean) / (group std + ε). When is the "
                 "numerator exactly 0 for every member of a group? Look at the score shares per group, or the spike "
                 "at 0 of the advantage boxes.",
                 "share = mean over real rows of all(advantages[row][response_mask[row] == 1] == 0), rows with at "
                 "least one response token; for GRPO = 8 × (number of groups whose 8 scores are equal) / 128."),
          rel=0.0, abs=5e-4, context=("run",))
def _e1(run=None) -> float:
    from ppolab.numbers import real_rows, resolve_run

    r = resolve_run(run)
    rec = r.step(r.steps[-1])
    t = rec.tensors
    real = real_rows(rec) & (t["response_mask"].sum(-1) > 0)
    zero = ((t["advantages"] != 0) & t["response_mask"].bool()).sum(-1) == 0
    return float(zero[real].float().mean())


@exercise("15.2", "The top of GRPO's advantage distribution: a group of 8 in which exactly one answer scores 1 and "
                  "seven score 0. What advantage does the right answer get (norm_adv_by_std_in_grpo = true, "
                  "ε = 1e-6, torch's default unbiased std)? (4 decimals)",
          hints=("Group mean 1/8; the numerator is 1 − 1/8. The std is torch.std of the eight scores: the unbiased "
                 "one, dividing by n − 1.",
                 "A = (1 − 1/8) / (std([1, 0, 0, 0, 0, 0, 0, 0]) + 1e-6) — compute_grpo_outcome_advantage on that "
                 "group, the first row."),
          rel=0.0, abs=5e-5)
def _e2() -> float:
    scores = torch.zeros(8, 1, dtype=torch.float64)
    scores[0, 0] = 1.0
    adv, _ = algos.compute_grpo_outcome_advantage(scores, torch.ones_like(scores), [0] * 8, epsilon=1e-6,
                                                  norm_adv_by_std_in_grpo=True)
    return float(adv[0, 0])


@exercise("15.3", "A colleague sends made-up numbers from the second half of a run (ppolab.exercises.lab15.SNIPPET). "
                  "Which warning fires? Answer the beginning of warning_signs' line, up to the opening parenthesis "
                  "(e.g. \"actor/ppo_kl large\").",
          hints=("Compare the first and the last values of each column: which metric changes by an order of "
                 "magnitude, and what does the chapter call that?",
                 "warning_signs(snippet): the entropy check compares the mean of the last 10 % with the first 10 % "
                 "(ratio below THRESHOLDS['entropy_collapse_ratio'])."),
          context=("frame",))
def _e3(frame=None) -> str:
    from ppolab.numbers.metrics import warning_signs

    found = warning_signs(SNIPPET if frame is None else frame)
    return found[0].split(" (")[0] if len(found) == 1 else f"{len(found)} warnings"


@exercise("15.4", "Over the second half of the training steps of the run (default grpo_tiny): the median of "
                  "kl_coef·kl_loss divided by the median of |pg_loss|.",
          hints=("The raw actor/kl_loss is not what the loss adds: multiply by actor/kl_coef first, then compare "
                 "with the size of pg_loss (its absolute value). Steps without training (step 0) do not count.",
                 "m = metrics[metrics['training/global_step'].notna()]; second = m.iloc[len(m)//2:]; "
                 "(second['actor/kl_coef'] * second['actor/kl_loss']).median() / "
                 "second['actor/pg_loss'].abs().median()."),
          context=("run",), needs=("kl_loss",))
def _e4(run=None) -> float:
    from ppolab.record import resolve_run

    m = resolve_run(run).metrics
    m = m[m["training/global_step"].notna()]
    second = m.iloc[len(m) // 2:]
    return float((second["actor/kl_coef"] * second["actor/kl_loss"]).median()
                 / second["actor/pg_loss"].abs().median())
