"""Steps that teach nothing, said once per run: all-zero advantages, or (almost) every prompt group scored alike.

A GRPO-style advantage is a score minus its group's mean, so a group whose responses all got the same score
contributes exactly nothing; when that holds for (almost) every group, the step trains on zeros and the run only
looks busy. :class:`LearningSignalWatch` reads each step's ``ppolab/signal/*`` metrics
(:func:`ppolab.metrics.signal_metrics`) and, the first time a step lacks signal, returns one warning sentence
naming the cause it can see: identical samples (and a temperature or top-k that makes sampling greedy),
a reward that depends only on the prompt, a constant reward (with the ground truth or function behind it), or a
task every sample already solves.
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

from ppolab.metrics import SIGNAL_METRICS
from ppolab.rewards import NUMERIC_SOURCES, RewardFn, compute_score, describe_reward_fn

#: A step lacks signal when at least this fraction of its groups is uniform (or every advantage is 0).
UNIFORM_FRACTION = 0.9
#: With at least this many groups a single such step is no accident; with fewer, it must repeat (see ``patience``).
MANY_GROUPS = 8
#: A rollout temperature below this samples (almost) greedily: the n samples of a prompt come out the same.
NEAR_GREEDY_TEMPERATURE = 0.1


def _is_number(text: str) -> bool:
    try:
        float(str(text).replace(",", ""))
    except ValueError:
        return False
    return True


class LearningSignalWatch:
    """Watches every step's learning signal; :meth:`see` returns a warning sentence once, at the first step that
    lacks it (see the module docstring), and None otherwise.

    ``rollout``: the ``actor_rollout_ref.rollout`` config (temperature, top_k, n) for naming a near-greedy
    sampler; ``patience``: how many consecutive steps with fewer than :data:`MANY_GROUPS` groups must lack signal
    before it is called (small batches are uniform by chance)."""

    def __init__(self, reward_fn: RewardFn, rollout: Any, patience: int = 3):
        self.reward_fn, self.rollout, self.patience = reward_fn, rollout, patience
        self.warned = False
        self.streak: list[dict[str, Any]] = []

    def see(self, metrics: Mapping[str, float], scores: Sequence[float], groups: int, data_sources: Sequence[str],
            ground_truths: Sequence[str], step: int) -> str | None:
        """``metrics``: the step's metrics (with ``ppolab/signal/*``); ``scores``, ``data_sources``,
        ``ground_truths``: of its real rows; ``groups``: how many prompt groups it had."""
        if self.warned or SIGNAL_METRICS[0] not in metrics:
            return None
        uniform, identical, zero = (float(metrics[k]) for k in SIGNAL_METRICS)
        # uniform groups cost signal only where they zero the advantages (a group-relative estimator): a critic's
        # advantages (GAE) stay non-zero on a group scored alike, so the zero fraction must show it too
        if not (zero >= 1.0 or uniform >= UNIFORM_FRACTION and zero >= UNIFORM_FRACTION):
            self.streak = []
            return None
        self.streak.append({"step": step, "scores": list(scores), "identical": identical, "uniform": uniform,
                            "sources": list(data_sources), "truths": list(ground_truths)})
        if groups < MANY_GROUPS and len(self.streak) < self.patience:
            return None
        self.warned = True
        return self._sentence(zero, uniform)

    def _sentence(self, zero: float, uniform: float) -> str:
        first, last = self.streak[0]["step"], self.streak[-1]["step"]
        when = f"step {last}" if first == last else f"steps {first}–{last}"
        what = ("every advantage is 0" if zero >= 1.0 else
                f"{uniform:.0%} of the prompt groups scored all their responses alike, so their advantages are 0")
        return (f"no learning signal at {when}: {what} and the update moves (almost) nothing (ppolab/signal/* in "
                f"the metrics); {self._cause()}")

    def _cause(self) -> str:
        r = self.rollout
        identical = min(s["identical"] for s in self.streak)
        if identical >= UNIFORM_FRACTION:
            knob = (f"actor_rollout_ref.rollout.temperature={r.temperature:g} is near 0, so sampling is almost greedy"
                    if r.temperature < NEAR_GREEDY_TEMPERATURE else
                    "actor_rollout_ref.rollout.top_k=1 keeps one candidate token" if r.top_k == 1 else
                    f"actor_rollout_ref.rollout.top_p={r.top_p:g} keeps (almost) one candidate token"
                    if r.top_p < NEAR_GREEDY_TEMPERATURE else
                    "the policy is (nearly) deterministic on these prompts")
            return (f"the cause: the {r.n} samples of each prompt are identical — {knob}; raise the temperature "
                    "(verl's default is 1.0) or check top_k / top_p")
        values = {v for s in self.streak for v in s["scores"]}
        if len(values) > 1:
            return ("the cause: the responses of a prompt differ but their scores do not — the reward depends only "
                    "on the prompt (not on the response), or each prompt is all-solved or all-failed; check the "
                    f"reward function {describe_reward_fn(self.reward_fn)} on a few responses of this run")
        value = next(iter(values)) if values else 0.0
        builtin = inspect.unwrap(self.reward_fn) is compute_score
        bad = [(d, g) for s in self.streak for d, g in zip(s["sources"], s["truths"])
               if builtin and d in NUMERIC_SOURCES and not _is_number(g)]
        head = f"every response got reward {value:g}"
        if bad:
            source, truth = bad[0]
            return (f"the cause: {head}; ground_truth {truth!r} (data_source {source!r}) is not a number, so the "
                    "built-in rule can never match it; fix reward_model.ground_truth in data.train_files")
        if not builtin:
            return (f"the cause: {head} — the reward function {describe_reward_fn(self.reward_fn)} returns "
                    f"{value:g} whatever the response; check it on a few responses of this run")
        if value == 0:
            return (f"the cause: {head} — the model never writes a correct '#### <number>' answer (check "
                    "actor_rollout_ref.model.path and data.max_response_length) or the data_source/ground_truth "
                    "do not fit the built-in rule")
        return f"the cause: {head} — every sample already solves the task; use harder prompts"
