"""The replay of the real actor update on the shipped grpo run's step 1 (chapter §13) and its explorer."""
from __future__ import annotations

import pytest
import torch

from ppolab.run.reader import Run
from ppolab.replay import max_abs_diff, mini_batch_rows, replay_actor_update, run_models
from ppolab.widgets.common import SHIPPED_RUNS

RUN = Run(SHIPPED_RUNS["grpo_tiny"])
FACTOR = 16.0  # data.max_response_length of grpo_tiny: Dr. GRPO's fixed loss_scale_factor
BUDGET = 96  # tokens per dynamic micro-batch: 16 micro-batches of the 64-row mini-batch
INVARIANT_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
#: |log-prob recomputed here − log-prob recorded on another CPU| allowed (justified where it is used).
CROSS_MACHINE_LOGPROB_ATOL = 1e-4


def replays(mode: str, factor) -> dict[str, dict]:
    kw = {"loss_agg_mode": mode, "loss_scale_factor": factor}
    return {"micro=1": replay_actor_update(RUN, micro_batch_size=1, **kw),
            "micro=mini": replay_actor_update(RUN, micro_batch_size=64, **kw),
            "dynamic": replay_actor_update(RUN, use_dynamic_bsz=True, max_token_len=BUDGET, **kw)}


@pytest.fixture(scope="module")
def token_mean():
    return replays("token-mean", FACTOR)


def test_first_mini_batch_is_the_first_64_rows():
    assert mini_batch_rows(RUN, 1, 0) == list(range(64))
    assert mini_batch_rows(RUN, 1, 1) == list(range(64, 128))


@pytest.mark.parametrize("mode", [m if m == "token-mean" else pytest.param(m, marks=pytest.mark.slow)
                                  for m in INVARIANT_MODES])
def test_same_update_for_every_micro_batching(mode, token_mean):
    out = token_mean if mode == "token-mean" else replays(mode, FACTOR)
    assert [len(p) for p in out["micro=1"]["micro_batches"]] == [1] * 64
    assert len(out["micro=mini"]["micro_batches"]) == 1
    assert 1 < len(out["dynamic"]["micro_batches"]) < 64
    ref = out["micro=mini"]
    assert max(float(g.abs().max()) for g in ref["grads"]) > 1e-3  # the update does something
    assert max_abs_diff(ref["update"], [-g for g in ref["grads"]]) == 0.0  # SGD(lr=1), no clipping
    for name in ("micro=1", "dynamic"):
        assert max_abs_diff(out[name]["grads"], ref["grads"]) <= 1e-5
        assert out[name]["metrics"]["actor/pg_loss"] == pytest.approx(ref["metrics"]["actor/pg_loss"], abs=1e-6)


def test_sum_norm_without_a_fixed_factor_breaks_invariance():
    kw = {"loss_agg_mode": "seq-mean-token-sum-norm", "loss_scale_factor": None}
    one = replay_actor_update(RUN, micro_batch_size=1, **kw)
    full = replay_actor_update(RUN, micro_batch_size=64, **kw)
    assert len(set(one["widths"])) > 1 and full["widths"] == [max(one["widths"])]
    assert max_abs_diff(one["grads"], full["grads"]) > 1e-3


def test_replay_sees_the_recorded_log_probs_and_restores_the_weights(token_mean):
    rec = RUN.step(1)
    before = [p.detach().clone() for p in run_models(RUN).actor_parameters()]
    own = replay_actor_update(RUN)  # the run's own micro-batching: the very forward the run made
    assert own["exact"] and own["settings"]["micro_batch_size"] == 32 and len(own["micro_batches"]) == 2
    recorded = rec["actor_log_probs"][0][own["rows"]]
    mask = rec["response_mask"][own["rows"]].bool()
    assert torch.equal(torch.isnan(recorded), torch.isnan(own["log_probs"]))
    # Recorded on another machine: its kernels sum in another order. fp32 bound for these log-probs: each logit
    # (|z| ≲ 30) is a dot product over hidden = 128, |Δz| ≲ √128·u·30 ≈ 2e-5 with u = 6e-8 (measured: 2.4e-6
    # here, 2.9e-6 on AMD EPYC, 1.3e-5 with MKL_CBWR=COMPATIBLE). Bit-exact only on the recording machine.
    assert float((own["log_probs"][mask] - recorded[mask]).abs().max()) <= CROSS_MACHINE_LOGPROB_ATOL
    one = token_mean["micro=1"]["log_probs"]  # 64 separate forwards: same numbers on the real tokens
    assert float((one[mask] - recorded[mask]).abs().max()) <= CROSS_MACHINE_LOGPROB_ATOL
    assert float((one[mask] - own["log_probs"][mask]).abs().max()) <= 1e-5  # same process: other shapes only
    after = run_models(RUN).actor_parameters()
    assert all(torch.equal(a, b) for a, b in zip(after, before))


def test_only_step_1_mini_batch_0_is_exact():
    with pytest.raises(ValueError, match="step 1"):
        replay_actor_update(RUN, step=5)
    with pytest.raises(ValueError, match="mini-batch 0"):
        replay_actor_update(RUN, mini_batch=1)


def test_explorer_figures_are_replay_outputs(token_mean):
    from ppolab.numbers import invariance
    from ppolab.widgets import invariance_explorer

    invariance._CACHE.clear()  # other tests' replays must not pre-fill the bars the lazy refresh leaves empty
    w = invariance_explorer(RUN, prefetch=False)
    assert w.prefetch is None  # a shipped run replays on demand (~0.25 s a replay)
    gap, micro = w.figures["gap"], w.figures["micro_batches"]
    assert list(gap.data[0].x[:7]) == ["1", "2", "4", "8", "16", "32", "64"]
    expected = max_abs_diff(token_mean["micro=1"]["grads"], token_mean["micro=mini"]["grads"])
    assert gap.data[0].y[0] == expected and gap.data[0].y[6] == 0.0
    assert max(gap.data[0].y) <= 1e-5 and w.state["invariant"]
    w.controls["dynamic"].value = True
    w.controls["max_token_len"].value = BUDGET
    assert gap.data[0].y[7] == max_abs_diff(token_mean["dynamic"]["grads"], token_mean["micro=mini"]["grads"])
    parts = token_mean["dynamic"]["micro_batches"]
    assert list(micro.data[1].y) == [len(p) for p in parts]
    assert list(micro.data[0].y) == [sum(token_mean["dynamic"]["seq_lens"][i] for i in p) for p in parts]
    w.controls["loss_agg_mode"].value = "seq-mean-token-sum-norm"
    assert w.state["invariant"]
    w.controls["scale"].value = "None"
    assert not w.state["invariant"] and w.state["gap"] > 1e-3
    assert gap.data[0].y[0] is None  # a control move replays only the chosen micro-batching and the reference
    w.controls["replay_all"].click()
    assert gap.data[0].y[0] > 1e-3 and gap.data[0].y[6] == 0.0
    w.controls["dynamic"].value = False
    for size in w.controls["micro_batch_size"].options:  # cached replays: cheap
        w.controls["micro_batch_size"].value = size
        assert w.state["n_micro"] == 64 // size
    w.controls["scale"].value = "fixed"
    assert w.state["invariant"]
    assert FACTOR in w.controls["scale_value"].options and 1.0 in w.controls["scale_value"].options
    w.controls["scale_value"].value = 1.0  # any fixed factor keeps sum-norm invariant
    assert w.state["invariant"]
    with pytest.raises(ValueError, match="step 1"):
        invariance_explorer(RUN, step=5)


@pytest.mark.slow  # a replay of its own (7–9 s): .ci/run's slow phase
def test_replay_builds_a_worker_not_a_trainer():
    """ppolab.replay is the actor worker on a recorded batch: importing it (and replaying) loads no dataset, reward
    or rollout module, and the recorded config is never written into."""
    import subprocess
    import sys

    code = ("import sys; from ppolab.replay import replay_actor_update; "
            "replay_actor_update('grpo_tiny', micro_batch_size=64, loss_agg_mode='token-mean'); "
            "bad = [m for m in sys.modules if m.split('.')[:2] in (['ppolab', 'data'], ['ppolab', 'rewards'], "
            "['ppolab', 'rollout'], ['ppolab', 'trainer'])]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
    before = RUN.ppo_config()
    replay_actor_update(RUN, micro_batch_size=2, loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=None)
    assert RUN.ppo_config() == before


def test_a_replay_is_keyed_by_what_the_worker_runs(token_mean):
    """Two settings that run the same update share one replay: a factor under a mode that does not read it, and
    two token budgets that pack the rows the same way. The replays themselves show the key is right."""
    from ppolab.numbers.invariance import distinct_budgets, replay_key
    from ppolab.replay import replay_partition

    key = lambda **kw: replay_key(RUN, **kw)  # noqa: E731
    assert key(loss_agg_mode="token-mean", loss_scale_factor=1.0, micro_batch_size=8) == \
        key(loss_agg_mode="token-mean", loss_scale_factor=None, micro_batch_size=8)
    assert key(loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=1.0, micro_batch_size=8) != \
        key(loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=None, micro_batch_size=8)
    other = replay_actor_update(RUN, micro_batch_size=64, loss_agg_mode="token-mean", loss_scale_factor=None)
    assert max_abs_diff(other["grads"], token_mean["micro=mini"]["grads"]) == 0.0  # FACTOR vs None: the same
    parts = replay_partition(RUN, use_dynamic_bsz=True, max_token_len=BUDGET)
    assert parts == token_mean["dynamic"]["micro_batches"]  # the partition a replay runs, without running it
    same = next(b for b in range(BUDGET + 1, BUDGET + 40)
                if replay_partition(RUN, use_dynamic_bsz=True, max_token_len=b) == parts)
    assert key(loss_agg_mode="token-mean", loss_scale_factor=None, max_token_len=same) == \
        key(loss_agg_mode="token-mean", loss_scale_factor=None, max_token_len=BUDGET)
    again = replay_actor_update(RUN, use_dynamic_bsz=True, max_token_len=same, loss_agg_mode="token-mean")
    assert max_abs_diff(again["grads"], token_mean["dynamic"]["grads"]) == 0.0
    budgets = distinct_budgets(RUN, 1, range(BUDGET, BUDGET + 40))
    assert budgets[0] == BUDGET and same not in budgets
    assert len({tuple(map(tuple, replay_partition(RUN, use_dynamic_bsz=True, max_token_len=b)))
                for b in budgets}) == len(budgets)


@pytest.mark.slow  # a replay of its own (7–9 s): .ci/run's slow phase
def test_a_background_prefetch_and_a_cell_take_turns(token_mean):
    """The explorer's background precompute and a lab cell replay on the same shared models: one at a time
    (``REPLAY_LOCK``), so what the cell gets is exactly a replay of its own, and the thread stops when told."""
    from ppolab.numbers import invariance
    from ppolab.widgets import invariance_explorer

    invariance._CACHE.clear()
    w = invariance_explorer(RUN, prefetch=True)
    assert w.prefetch is not None and w.prefetch.is_alive()
    out = invariance.cached_replay(RUN, loss_agg_mode="seq-mean-token-mean", loss_scale_factor=None,
                                   micro_batch_size=4)
    w.stop_prefetch.set()
    w.prefetch.join(timeout=120)
    assert not w.prefetch.is_alive()
    fresh = replay_actor_update(RUN, micro_batch_size=4, loss_agg_mode="seq-mean-token-mean")
    assert max_abs_diff(out["grads"], fresh["grads"]) == 0.0
    assert max_abs_diff(replay_actor_update(RUN, micro_batch_size=64, loss_agg_mode="token-mean")["grads"],
                        token_mean["micro=mini"]["grads"]) == 0.0  # the weights were put back every time


@pytest.mark.slow  # a replay, then five forwards of the mini-batch: lab 03 cites it and leaves it to the learner
def test_lab_03s_large_drift_replay_is_where_the_lab_says_and_no_token_passes_the_clamp():
    import ppolab.numbers

    out = ppolab.numbers.large_step_replay("grpo_tiny")  # the path lab 03's text gives
    scales = out["scales"]
    assert [s["scale"] for s in scales] == [1.0, 10.0, 100.0, 1000.0, 10000.0] and out["rows"] > 0
    assert all(s["n_clamped"] == 0 and s["max_abs_log_ratio"] < 20 for s in scales), scales
    assert scales[0]["max_abs_log_ratio"] < scales[1]["max_abs_log_ratio"]  # a longer step drifts further


# ------------------------------------------------------------------------ the forward passes' micro-batches (§11.6)
@pytest.mark.parametrize("reference", [False, True], ids=["old", "ref"])
def test_a_forward_pass_changes_with_its_micro_batching_at_rounding_only(reference):
    """Stage 4's π_old and stage 5's π_ref rerun by the worker's forward (lab 13's §11.6 cell): at every batching
    the recorded log-probs come back (within the cross-machine rounding), the micro-batches are the ones asked for
    — one per row, one for all, or packed within the token budget — and no weight of the shared models moves."""
    from ppolab.replay import replay_forward

    before = [p.detach().clone() for p in run_models(RUN).actor_parameters()]
    t = RUN.step(1).tensors
    lengths = (t["prompt_mask"].sum(-1) + t["response_mask"].sum(-1)).tolist()
    n = len(lengths)
    own = replay_forward(RUN, reference=reference)
    assert own["rows"] == list(range(n))  # a 29-token vocabulary: every row fits
    m = own["response_mask"].bool()
    for kw, count in (({"micro_batch_size": 1}, n), ({"micro_batch_size": n}, 1), ({"max_token_len": 100}, None)):
        out = replay_forward(RUN, reference=reference, **kw)
        assert sorted(i for part in out["micro_batches"] for i in part) == list(range(n))
        if count is not None:
            assert len(out["micro_batches"]) == count
        else:
            assert all(sum(lengths[i] for i in part) <= 100 for part in out["micro_batches"])
            assert len(out["micro_batches"]) > 1
        assert float((out["log_probs"] - own["log_probs"])[m].abs().max()) < 1e-5
        assert float((out["log_probs"] - out["recorded"])[m].abs().max()) < CROSS_MACHINE_LOGPROB_ATOL
    assert max_abs_diff(before, [p.detach() for p in run_models(RUN).actor_parameters()]) == 0.0
    # a bound on the logits (a real vocabulary's) keeps the first group of rollout.n rows, and their recorded values
    few = replay_forward(RUN, reference=reference, max_logits=1)
    group = RUN.ppo_config().actor_rollout_ref.rollout.n
    assert few["rows"] == list(range(group)) and few["log_probs"].shape[0] == group
    assert torch.equal(few["recorded"], own["recorded"][:group])
    with pytest.raises(ValueError, match="not both"):
        replay_forward(RUN, micro_batch_size=1, max_token_len=100)
