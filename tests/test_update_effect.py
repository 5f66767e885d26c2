"""Where the update went (ppolab.numbers.update_effect): a replayed optimizer step is the training's own, and the
mechanisms the chapter's title asks about show on real recorded steps."""
from __future__ import annotations

import re

import pytest
import torch

from ppolab.numbers.update_effect import CLIP_STATES, replayable_steps, step_effect
from ppolab.run.reader import Run

from helpers import NO_VAL, TINY

pytestmark = pytest.mark.spread  # each test on a worker of its own: the replays are the costly part

#: 2 prompts × 2 answers, one prompt a mini-batch, 2 epochs: 4 optimizer steps in step 1, two of them after the first.
SEVERAL = [*TINY, *NO_VAL, "actor_rollout_ref.actor.ppo_mini_batch_size=1", "actor_rollout_ref.actor.ppo_epochs=2",
           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "trainer.total_training_steps=1"]


@pytest.fixture(scope="module")
def several(trained_run) -> Run:
    return Run(trained_run("grpo_tiny", SEVERAL))


def test_a_replayed_step_reproduces_the_trainings_after_state(several):
    """After replayed optimizer step k, the model computes on the rows of step k + 1 the log-probs the training's
    forward recorded there (actor_log_probs[k + 1]): the replay starts where training started and steps as it did."""
    recorded = several.step(1).tensors["actor_log_probs"]
    n = recorded.shape[0]
    assert n == 4
    worst = 0.0
    for k in range(n - 1):
        e = step_effect(several, 1, k)
        nxt = step_effect(several, 1, k + 1)["rows"]
        mask = e["mask"][nxt] > 0
        after, seen = e["log_prob_after"][nxt][mask], recorded[k + 1][nxt][mask]
        assert not torch.isnan(seen).any()
        worst = max(worst, float((after - seen).abs().max()))
        # and before step k + 1 is after step k
        torch.testing.assert_close(step_effect(several, 1, k + 1)["log_prob_before"], e["log_prob_after"])
    assert worst < 1e-5, worst
    moved = [float(e["delta"].nan_to_num().abs().max()) for e in (step_effect(several, 1, k) for k in range(n))]
    assert min(moved) > 1e-4  # every step moved the model: the comparison above is not of an unchanged model


def test_asking_for_each_optimizer_step_in_turn_replays_the_update_once(several, monkeypatch):
    """step_effect(run, 1, 0), (…, 1), … — as lab 18 reads them — replay the step's optimizer steps once in all, not
    1 + 2 + … + n: a later call goes on from the weights and Adam state where the last one stopped, and measures
    what a replay straight through to that step measures, bit for bit. Asked for step 0 alone, one step is run."""
    from ppolab.numbers import update_effect
    from ppolab.worker import ActorWorker

    taken = []
    real = ActorWorker.optimizer_step_of
    monkeypatch.setattr(ActorWorker, "optimizer_step_of", lambda self, *a, **k: taken.append(1) or real(self, *a, **k))
    n = update_effect.n_optimizer_steps(several, 1)
    assert n > 2
    monkeypatch.setattr(update_effect, "_CACHE", {})
    step_effect(several, 1, 0)
    assert len(taken) == 1
    in_turn = [step_effect(several, 1, k) for k in range(n)]
    assert len(taken) == n
    monkeypatch.setattr(update_effect, "_CACHE", {})
    straight = step_effect(several, 1, n - 1)
    assert len(taken) == 2 * n
    for key in ("after", "grads", "update"):
        for x, y in zip(in_turn[-1][key], straight[key]):
            assert torch.equal(x, y), key
    assert torch.equal(in_turn[-1]["log_prob_after"], straight["log_prob_after"])
    assert in_turn[-1]["metrics"] == straight["metrics"]


def test_a_replay_interrupted_midway_leaves_nothing_half_done(several, monkeypatch):
    """A replay stopped midway (a learner interrupting the cell) caches none of its steps, so the next call starts
    from the last whole replay's state and measures what an uninterrupted one does."""
    from ppolab.numbers import update_effect
    from ppolab.worker import ActorWorker

    monkeypatch.setattr(update_effect, "_CACHE", {})
    n = update_effect.n_optimizer_steps(several, 1)
    want = step_effect(several, 1, n - 1)["after"]
    monkeypatch.setattr(update_effect, "_CACHE", {})
    step_effect(several, 1, 0)
    real, calls = ActorWorker.optimizer_step_of, []

    def stop_at_the_second(self, *a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(ActorWorker, "optimizer_step_of", stop_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        step_effect(several, 1, n - 1)
    monkeypatch.setattr(ActorWorker, "optimizer_step_of", real)
    assert sorted(update_effect._CACHE[next(iter(update_effect._CACHE))]["steps"]) == [0]
    for x, y in zip(step_effect(several, 1, n - 1)["after"], want):
        assert torch.equal(x, y)


def test_the_terms_gradients_are_each_terms_own_and_add_up_to_the_total(several):
    """The KL term's gradient is a backward pass of its own; pg's is the step's gradient before the clip minus it.
    Here pg's is checked against a backward pass of pg alone at the weights before the step (what the replay saves):
    the separate passes add up to the step's gradient."""
    from ppolab.numbers.update_effect import one_process, step_batch
    from ppolab.replay import REPLAY_LOCK, gradients, restore, run_models
    from ppolab.update_plan import recorded_plan
    from ppolab.worker import ActorWorker

    cfg = several.ppo_config()
    plan, batch = recorded_plan(several.step(1), cfg, "actor"), step_batch(several, 1)
    for k in range(2):
        e = step_effect(several, 1, k)
        assert list(e["terms"]) == ["pg", "kl"]  # grpo_tiny: the policy gradient and the k3 KL loss
        with REPLAY_LOCK:
            models = run_models(several)
            params = models.actor_parameters()
            saved = [p.detach().clone() for p in params]
            restore(params, e["before"])
            worker = ActorWorker(cfg.actor_rollout_ref.actor, models, rollout_n=cfg.actor_rollout_ref.rollout.n,
                                 temperature=cfg.actor_rollout_ref.rollout.temperature)
            try:
                worker.terms = ("pg",)
                worker.backward_of(batch, one_process(plan.steps[k]))
                direct = gradients(params)
            finally:
                restore(params, saved)
        assert any(float(d.abs().max()) > 0 for d in direct)
        for d, g in zip(direct, e["terms"]["pg"]):
            torch.testing.assert_close(g, d, atol=1e-7, rtol=1e-5)
        for i, g in enumerate(e["grads"]):  # the gradient Adam consumed, before the global-norm clip
            total = sum(term[i] for term in e["terms"].values())
            torch.testing.assert_close(total, g / e["clip_coef"], atol=1e-7, rtol=1e-5)


def test_the_first_step_of_a_lora_run_gives_A_no_gradient():
    """B = 0 at the seeded start, so ∂L/∂A = Bᵀ(…) = 0: only B gets a gradient; A moves only by AdamW's weight
    decay (lr · weight_decay · A)."""
    e = step_effect("grpo_tiny", 1, 0)
    a = [p for p in e["params"] if p["name"].endswith("lora_A")]
    b = [p for p in e["params"] if p["name"].endswith("lora_B")]
    assert a and b and len(a) == len(b)
    assert all(p["grad_norm"] == 0.0 for p in a) and all(p["grad_norm"] > 0 for p in b)
    assert all(p["before_norm"] == 0.0 for p in b)
    from ppolab.run.reader import resolve_run

    wd = resolve_run("grpo_tiny").ppo_config().actor_rollout_ref.actor.optim.weight_decay
    for p in a:  # (a change of ~1e-6 of each weight: fp32 rounds it by a few per cent)
        assert p["delta_norm"] == pytest.approx(e["lr"] * wd * p["before_norm"], rel=0.05)


def test_a_clipped_token_with_no_gradient_of_its_own_still_moves():
    """A token whose clip binds contributes no gradient (its coefficient ∂L/∂log π is 0), yet the optimizer step
    changes its log-prob: the parameters it shares with the other tokens moved."""
    found = 0
    for name in ("grpo_tiny", "ppo_fire_tiny"):
        for k in (1, 2, 3):
            e = step_effect(name, 1, k)
            rows = e["in_mini_batch"].unsqueeze(-1)
            clipped = (e["clip_state"] > 0) & rows
            if not clipped.any():
                continue
            assert (e["coefficient"][clipped] == 0).all()
            inside = (e["clip_state"] == 0) & rows & (e["advantages"] != 0)
            assert (e["coefficient"][inside] != 0).any()
            assert (e["delta"][clipped].abs() > 1e-6).any()
            found += int(clipped.sum())
    assert found > 0, "no recorded step with a clipped token"


def test_clip_states_name_every_code():
    assert CLIP_STATES == ("inside", "clipped above", "clipped below", "dual-clipped")


def test_later_steps_say_what_the_run_lacks():
    from ppolab.numbers.needs import RunLacks

    with pytest.raises(RunLacks, match="before step 5.*record_update_state=true"):
        step_effect("grpo_tiny", 5, 0)
    assert replayable_steps("grpo_tiny") == [1]


#: SEVERAL for 3 steps, steps 1–3 recorded with the actor's state before each update.
KEPT = [*SEVERAL, "trainer.total_training_steps=3", "trainer.record_update_state=true"]


@pytest.fixture(scope="module")
def kept(trained_run) -> Run:
    return Run(trained_run("grpo_tiny", KEPT))


def test_the_recorded_state_before_a_step_is_where_the_previous_step_left_the_actor(kept):
    """Replaying every optimizer step of step 1 ends exactly (same machine, fp32) at the weights recorded before
    step 2's update; step 2's recorded state holds Adam's moments of the 4 steps taken, step 1's none."""
    assert replayable_steps(kept) == [1, 2, 3]
    last = step_effect(kept, 1, 3)
    state = kept.step(2).update_state()
    after = last["after"]
    assert len(after) == len(state["weights"])
    for i, a in enumerate(after):
        assert torch.equal(a, state["weights"][f"actor.{i}"]), last["names"][i]
    assert all(float(s["step"]) == 4 for s in state["optimizer"]["state"].values())
    assert kept.step(1).update_state()["optimizer"]["state"] == {}
    n = sum(v.numel() for v in state["weights"].values())
    extra = sum(v.numel() * v.element_size() for k, v in kept.step(2).tensors.items() if k.startswith("update_state."))
    assert n * 12 <= extra <= n * 12 + 8 * len(state["weights"])  # weights + exp_avg + exp_avg_sq (+ step counts)


def test_a_later_step_replays_from_its_recorded_state(kept):
    """Optimizer step k of steps 2 and 3, replayed from the recorded state, leaves the model computing the log-probs
    the training's forward recorded at optimizer step k + 1."""
    worst = 0.0
    for step in (2, 3):
        recorded = kept.step(step).tensors["actor_log_probs"]
        for k in range(recorded.shape[0] - 1):
            e = step_effect(kept, step, k)
            nxt = step_effect(kept, step, k + 1)["rows"]
            mask = e["mask"][nxt] > 0
            worst = max(worst, float((e["log_prob_after"][nxt][mask] - recorded[k + 1][nxt][mask]).abs().max()))
        # the state's log-probs before the first optimizer step are the ones the trainer recorded as old
        first = step_effect(kept, step, 0)
        old = kept.step(step).tensors["old_log_probs"]
        m = first["mask"] > 0
        assert float((first["log_prob_before"][m] - old[m]).abs().max()) < 1e-5
    assert worst < 1e-5, worst


def test_the_explorer_offers_every_replayable_step(kept):
    from ppolab.widgets.update_effect import update_effect_explorer

    w = update_effect_explorer(kept)
    assert list(w.controls["step"].options) == [1, 2, 3]
    w.controls["opt_step"].value = 3
    w.controls["step"].value = 2
    assert w.state["step"] == 2 and w.state["effect"]["step"] == 2 and w.state["opt_step"] == 3
    torch.testing.assert_close(w.state["effect"]["delta"], step_effect(kept, 2, 3)["delta"], equal_nan=True)
    assert "step" not in update_effect_explorer("grpo_tiny").controls  # only step 1 replays there: no control


def test_adams_step_splits_exactly_into_decay_momentum_and_gain(several):
    """Δθ = decay + momentum + gain ⊙ g on every tensor of every optimizer step (torch's AdamW, read back from its
    state); at the first step Adam carries nothing (momentum 0) and every gain entry is negative."""
    for k in range(4):
        e = step_effect(several, 1, k)
        parts = e["adam"]
        for d, m, gain, g, u in zip(parts["decay"], parts["momentum"], parts["gain"], e["grads"], e["update"]):
            torch.testing.assert_close(d + m + gain * g, u, rtol=0, atol=1e-7)
            assert (gain < 0).all()
            if k == 0:
                assert float(m.abs().max()) < 1e-9
        assert k == 0 or any(float(m.abs().max()) > 1e-6 for m in parts["momentum"])


def test_a_tokens_first_order_move_is_its_gradient_along_the_step(several):
    """token_moves' first order (∇ log π · Δθ from one backward per token) equals log π's difference quotient along
    the step, measured by two forwards at θ ± h·Δθ; the realised move is close to it; the parts add up to it; a
    token's own part has its advantage's sign and is 0 where its coefficient is."""
    from ppolab.numbers.token_moves import token_moves
    from ppolab.replay import REPLAY_LOCK, restore, run_models
    from ppolab.numbers.update_effect import step_batch
    from ppolab.update_plan import InferBatching
    from ppolab.worker import ActorWorker

    k = 1
    e = step_effect(several, 1, k)
    real = (e["mask"] > 0).nonzero().tolist()
    moves = token_moves(several, 1, k, [tuple(t) for t in real])
    cfg = several.ppo_config()
    batch = step_batch(several, 1)
    h = 0.1
    with REPLAY_LOCK:
        models = run_models(several)
        params = models.actor_parameters()
        saved = [p.detach().clone() for p in params]
        worker = ActorWorker(cfg.actor_rollout_ref.actor, models, temperature=cfg.actor_rollout_ref.rollout.temperature)
        try:
            side = []
            for s in (h, -h):
                restore(params, [b + s * u for b, u in zip(e["before"], e["update"])])
                side.append(worker.infer(batch, InferBatching(len(batch)))["log_probs"])
        finally:
            restore(params, saved)
    quotient = (side[0] - side[1]) / (2 * h)
    assert len(moves) == len(real) > 4
    for m in moves:
        assert m["first_order"] == pytest.approx(float(quotient[m["row"], m["pos"]]), rel=2e-2, abs=2e-5)
        assert m["own"] + m["rest"] + m["momentum"] + m["decay"] == pytest.approx(m["first_order"], rel=1e-4,
                                                                                     abs=1e-8)
        if m["coefficient"] == 0:
            assert m["own"] == 0
        elif m["advantage"] != 0:
            assert (m["own"] > 0) == (m["advantage"] > 0)
    assert any(m["own"] != 0 for m in moves) and any(m["clip_state"] == -2 for m in moves)
    realised = torch.tensor([m["realised"] for m in moves])
    first = torch.tensor([m["first_order"] for m in moves])
    moved = first.abs() > 1e-4  # (a token at probability ≈ 1 moves by ~1e-7: float rounding of log π)
    assert int(moved.sum()) > 4
    assert float(torch.corrcoef(torch.stack([realised, first]))[0, 1]) > 0.95
    assert float(((realised - first).abs() / first.abs())[moved].median()) < 0.2


def test_the_telling_tokens_and_what_token_moves_refuses():
    """On a shipped run the step lab 18 shows has a token of every kind, each the kind's largest move; a token that
    is not a (row, position) of the step's response is one line naming it."""
    from ppolab.numbers.token_moves import KINDS, telling_step, token_moves

    k = telling_step("grpo_tiny", 1)
    e = step_effect("grpo_tiny", 1, k)
    moves = token_moves("grpo_tiny", 1, k)
    assert [m["kind"] for m in moves] == list(KINDS)
    clipped = next(m for m in moves if m["kind"] == "clipped")
    assert clipped["own"] == 0 and clipped["clip_state"] > 0 and abs(clipped["realised"]) > 1e-3
    trained = (e["mask"] > 0) & e["in_mini_batch"].unsqueeze(-1) & (e["clip_state"] > 0)
    assert abs(clipped["realised"]) == pytest.approx(float(e["delta"][trained].abs().max()))
    n, width = e["mask"].shape
    for bad, words in ((["x"], "tokens[0]='x' is not a (row, position) pair"), ([(n, 0)], "tokens[0] row"),
                       ([(0, 1.5)], "tokens[0] position")):
        with pytest.raises((ValueError, TypeError), match=re.escape(words)):
            token_moves("grpo_tiny", 1, k, bad)
    pad = (e["mask"][0] == 0).nonzero()
    if len(pad):
        with pytest.raises(ValueError, match="response_mask is 0"):
            token_moves("grpo_tiny", 1, k, [(0, int(pad[0]))])

