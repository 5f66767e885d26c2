"""What a run has, and the one exception that says what it lacks.

An exercise or explorer that needs a mechanism (a critic, the reward-side KL, padding rows, …) asks
:func:`require`; a run without it raises :class:`RunLacks`, which the caller turns into one line naming a shipped run
that has it. Anything else a run lacks by accident (a torn file, a step that is not there) stays an ordinary error.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ppolab.run.reader import SHIPPED_RUNS, Run, resolve_run


class RunLacks(LookupError):
    """``run`` lacks ``what`` (an English phrase, translated where it is shown): not a bug, another run has it."""

    def __init__(self, what: str, run: Run | None = None):
        self.what, self.run = what, run
        super().__init__(f"{run_label(run)} lacks {what}")


def run_label(run: Run | str | None) -> str:
    """A shipped run's name, else the run's path (how the lacks line names a run)."""
    if run is None:
        return "this run"
    path = Path(run.path if isinstance(run, Run) else run)
    for name, shipped in SHIPPED_RUNS.items():
        if path.resolve() == shipped.resolve() or str(run) == name:
            return name
    return str(path)


def _first(r: Run):
    return r.step(r.steps[0])


def _config(r: Run):
    return r.ppo_config()


def _opt_steps(r: Run) -> int:
    return int(_first(r).tensors["actor_log_probs"].shape[0])


def _has_padding(r: Run) -> bool:
    t = _first(r).tensors
    return "is_pad" in t and bool(t["is_pad"].bool().any())


def _has_step1_gradient(r: Run) -> bool:
    """Whether the rows a replay of step 1 updates (:func:`ppolab.replay.replay_rows`) carry an advantage ≠ 0 on a
    response token: without one the policy loss has no gradient there (a run with no learning signal yet)."""
    from ppolab.replay import replay_rows

    t = r.step(1).tensors
    rows = replay_rows(r)
    return bool((t["advantages"][rows] * t["response_mask"][rows]).abs().max() > 0)


def _has_rollout_gap(r: Run) -> bool:
    t = _first(r).tensors
    if "rollout_log_probs" not in t:
        return False
    m = t["response_mask"].bool()
    return bool(((t["rollout_log_probs"] - t["old_log_probs"])[m].abs().max() > 1e-5)) if m.any() else False


def _ragged_step1(r: Run) -> bool:
    from ppolab.numbers.steps import optimizer_step_batch

    lengths = optimizer_step_batch(r.step(1), 0)["response_mask"].sum(-1)
    return bool(lengths.max() > lengths.min())


def _has_validation(r: Run) -> bool:
    s = r.summary
    return all("val/accuracy" in (s.get(k) or {}) for k in ("val_before", "val_after"))


@dataclass(frozen=True)
class Need:
    """One thing a run may have: ``what`` it is (the phrase of the lacks line) and ``has(run)``."""
    what: str
    has: Callable[[Run], bool]


#: Every need an exercise can declare, by name. ``has`` may assume the run has recorded steps (``"steps"`` first).
NEEDS: dict[str, Need] = {
    "steps": Need("recorded steps (trainer.record_freq > 0)", lambda r: bool(r.steps)),
    "step1": Need("a recorded step 1", lambda r: 1 in r.steps),
    "step1_ragged": Need("responses of different lengths in step 1's first optimizer step",
                         lambda r: 1 in r.steps and _ragged_step1(r)),
    "step1_gradient": Need("a policy gradient at step 1 (an advantage ≠ 0 in the mini-batch a replay updates)",
                           lambda r: 1 in r.steps and _has_step1_gradient(r)),
    "critic": Need("a critic (critic_vpreds: algorithm.adv_estimator=gae)",
                   lambda r: "critic_vpreds" in _first(r).tensors),
    "critic_updates": Need("several critic optimizer steps per training step",
                           lambda r: "critic_vpreds" in _first(r).tensors
                           and _first(r).tensors["critic_vpreds"].shape[0] > 1),
    "reference": Need("a reference policy (ref_log_prob: use_kl_loss or use_kl_in_reward)",
                      lambda r: "ref_log_prob" in _first(r).tensors),
    "kl_in_reward": Need("the reward-side KL (algorithm.use_kl_in_reward=true)",
                         lambda r: bool(_config(r).algorithm.use_kl_in_reward)),
    "adaptive_kl": Need("the adaptive KL controller (use_kl_in_reward with algorithm.kl_ctrl.type=adaptive)",
                        lambda r: bool(_config(r).algorithm.use_kl_in_reward)
                        and _config(r).algorithm.kl_ctrl.type == "adaptive"),
    "kl_loss": Need("a KL loss (actor_rollout_ref.actor.use_kl_loss=true)",
                    lambda r: bool(_config(r).actor_rollout_ref.actor.use_kl_loss)),
    "update_entropy": Need("π_θ's entropy at every optimizer step (actor_entropy, which older recordings lack: "
                           "re-record the run)",
                           lambda r: "actor_entropy" in _first(r).tensors
                           or not (_config(r).actor_rollout_ref.actor.entropy_coeff
                                   or _config(r).actor_rollout_ref.actor.calculate_entropy)),
    "vanilla_loss": Need("the vanilla clipped policy loss the capstone rebuilds (actor.policy_loss.loss_mode=vanilla)",
                         lambda r: _config(r).actor_rollout_ref.actor.policy_loss.loss_mode == "vanilla"),
    "opt_steps": Need("several optimizer steps per training step", lambda r: _opt_steps(r) > 1),
    "epochs": Need("a second PPO epoch (actor.ppo_epochs ≥ 2)",
                   lambda r: _config(r).actor_rollout_ref.actor.ppo_epochs >= 2 and _opt_steps(r) > 1),
    "unshuffled": Need("unshuffled mini-batches (actor.shuffle=false)",
                       lambda r: not _config(r).actor_rollout_ref.actor.shuffle),
    "padding_rows": Need("synthetic padding rows (is_pad)", _has_padding),
    "rejection": Need("rollout rejection sampling (algorithm.rollout_correction.rollout_rs)",
                      lambda r: bool(_config(r).algorithm.rollout_correction.rollout_rs)),
    "tool_obs": Need("tool observations (a multi-turn tool run: rollout.multi_turn.enable)",
                     lambda r: bool(_config(r).actor_rollout_ref.rollout.multi_turn.enable)
                     and "response_attention_mask" in _first(r).tensors),
    "rollout_gap": Need("rollout log-probs from another engine or precision (a rollout/trainer gap)",
                        _has_rollout_gap),
    "validation": Need("a validation before and after training (summary.json val_before / val_after)",
                       _has_validation),
}


def require(run: Run | str | None, *names: str, default: str = "grpo_tiny") -> Run:
    """The resolved run, if it has every need in ``names`` (recorded steps always); else :class:`RunLacks`."""
    r = resolve_run(run, default)
    for name in ("steps", *names):
        if not NEEDS[name].has(r):
            raise RunLacks(NEEDS[name].what, r)
    return r


def lacks_line(lacks: RunLacks, shipped: str) -> str:
    """One line for a lab's section: what this run lacks and the shipped run that has it (the exercises' wording)."""
    from ppolab.i18n import tr

    line = tr("this run ({run}) lacks {what}; the shipped run {name} has it").format(
        run=tr("this run") if lacks.run is None else run_label(lacks.run), what=tr(lacks.what), name=shipped)
    return line + f' — RUN = "{shipped}"'  # code: the same in every language


def has(run: Run | str | None, *names: str, shipped: str) -> bool:
    """Whether ``run`` has every need in ``names`` (:data:`NEEDS`); if not, print :func:`lacks_line` naming
    ``shipped`` (the lab's own run) and return False, so the lab's section is skipped and the lab goes on."""
    try:
        require(run, *names, default=shipped)
    except RunLacks as e:
        print(lacks_line(e, shipped))
        return False
    return True


def find(finder: Callable[..., dict], run: Run | str | None, *args, shipped: str, show: bool = True) -> dict | None:
    """``finder(run, *args)`` (a case finder of :mod:`ppolab.numbers.cases`, or an exercise's case function): the
    case, printed in one line; where the run lacks the mechanism, :func:`lacks_line` is printed and None returned.
    ``show=False`` prints neither (a cell whose ``prompt`` already says it)."""
    try:
        found = finder(resolve_run(run, shipped), *args)
    except RunLacks as e:
        if show:
            print(lacks_line(e, shipped))
        return None
    if show:
        print(case_line(found))
    return found


_FIELDS = {"step": "recorded step", "opt_step": "optimizer step", "update": "critic optimizer step",
           "row": "row"}


def case_line(found: dict) -> str:
    """The case a finder chose, in one line: ``case in this run: recorded step 24, optimizer step 8``."""
    from ppolab.i18n import get_language, tr

    parts = [f"{tr(_FIELDS[k])} {v}" for k, v in found.items() if k in _FIELDS]
    return tr("case in this run: {parts}").format(parts=("，" if get_language() == "zh" else ", ").join(parts))
