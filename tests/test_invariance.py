"""Micro-batch and data-parallel invariance of the globally normalised losses (chapter §13), and
property tests of the clipped objective (chapter §4)."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import ppolab.algos as A
from ppolab.config import LOSS_AGG_MODES, ActorConfig

DT = torch.float64


def make_batch(seed: int, bs: int = 8, width: int = 7):
    """A mini-batch with ragged lengths, one all-masked synthetic padding row and random tensors."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (bs,), generator=g)
    lengths[-1] = 0  # a synthetic padding sample (response_mask all zero, facts §9.3)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).to(DT)
    old = -torch.rand(bs, width, generator=g, dtype=DT) * 3
    lp = old + 0.4 * torch.randn(bs, width, generator=g, dtype=DT)
    adv = torch.randn(bs, 1, generator=g, dtype=DT).expand(bs, width).contiguous()
    return old, lp, adv, mask


def micro_loss_sum(old, lp, adv, mask, mode, splits, ragged, loss_scale_factor):
    """Sum over micro-batches of the vanilla loss, each normalised by the *global* mini-batch counts."""
    batch_num_tokens = mask.sum()
    global_batch_size = mask.shape[0]  # mini × n sequences, padding rows included (facts §3)
    total = 0.0
    for rows in torch.tensor_split(torch.arange(mask.shape[0]), splits):
        m = mask[rows]
        width = max(int(m.sum(-1).max()), 1) if ragged else m.shape[1]  # ragged: trim to this micro-batch
        cfg = ActorConfig(
            loss_agg_mode=mode,
            global_batch_info=dict(dp_size=1, batch_num_tokens=batch_num_tokens, global_batch_size=global_batch_size,
                                   loss_scale_factor=loss_scale_factor),
        )
        loss, _ = A.compute_policy_loss_vanilla(
            old[rows, :width], lp[rows, :width], adv[rows, :width], m[:, :width], mode, cfg
        )
        total = total + loss
    return total


def whole_loss(old, lp, adv, mask, mode, loss_scale_factor):
    cfg = ActorConfig(loss_agg_mode=mode, global_batch_info=dict(
        batch_num_tokens=mask.sum(), global_batch_size=mask.shape[0], loss_scale_factor=loss_scale_factor))
    return A.compute_policy_loss_vanilla(old, lp, adv, mask, mode, cfg)[0]


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("splits", [1, 2, 4])
@pytest.mark.parametrize("ragged", [False, True])
def test_micro_batch_invariance_loss_and_gradient(mode, splits, ragged):
    scale = 7.0 if mode == "seq-mean-token-sum-norm" else None  # a fixed factor (Dr. GRPO style)
    old, lp, adv, mask = make_batch(seed=splits + 10 * ragged)
    lp_whole = lp.clone().requires_grad_(True)
    lp_micro = lp.clone().requires_grad_(True)
    ref = whole_loss(old, lp_whole, adv, mask, mode, scale)
    got = micro_loss_sum(old, lp_micro, adv, mask, mode, splits, ragged, scale)
    ref.backward()
    got.backward()
    assert got.item() == pytest.approx(ref.item(), abs=1e-6)
    assert torch.allclose(lp_micro.grad, lp_whole.grad, atol=1e-6)


def test_seq_mean_token_sum_norm_without_scale_factor_breaks_invariance():
    """Chapter §10.5/§13: with loss_scale_factor=None each micro-batch divides by its own padded width."""
    old, lp, adv, mask = make_batch(seed=3)
    mode = "seq-mean-token-sum-norm"
    ref = whole_loss(old, lp, adv, mask, mode, None)
    same_width = micro_loss_sum(old, lp, adv, mask, mode, 4, ragged=False, loss_scale_factor=None)
    ragged = micro_loss_sum(old, lp, adv, mask, mode, 4, ragged=True, loss_scale_factor=None)
    assert same_width.item() == pytest.approx(ref.item(), abs=1e-9)  # widths equal → still fine
    assert abs(ragged.item() - ref.item()) > 1e-3  # widths differ → the objective's scale moved


def test_padding_rows_get_zero_gradient_in_every_mode():
    old, lp, adv, mask = make_batch(seed=5)
    lp[-1] = float("nan")  # whatever sits in a fully masked row must not matter for token modes
    for mode in LOSS_AGG_MODES:
        x = lp.clone()
        x[-1] = -1.0
        x.requires_grad_(True)
        loss = whole_loss(old, x, adv, mask, mode, 7.0)
        loss.backward()
        assert x.grad[-1].abs().max().item() == 0.0, mode
        assert math.isfinite(loss.item())


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_dp_split_with_global_normalisation_equals_single_process(mode):
    """Each rank divides by the global count and multiplies by dp_size; DDP then averages (facts §3)."""
    old, lp, adv, mask = make_batch(seed=11, bs=8)
    token_losses = A.ppo_clip_terms(old, lp, adv, 0.2, 0.2)["pg_losses"]
    ref = A.agg_loss(token_losses, mask, mode, batch_num_tokens=mask.sum(), global_batch_size=8,
                     loss_scale_factor=7.0)
    for dp in (2, 4):
        per_rank = [
            A.agg_loss(token_losses[rows], mask[rows], mode, dp_size=dp, batch_num_tokens=mask.sum(),
                       global_batch_size=8, loss_scale_factor=7.0)
            for rows in torch.arange(8).chunk(dp)
        ]
        assert (sum(per_rank) / dp).item() == pytest.approx(ref.item(), abs=1e-9)


# ---------------------------------------------------------------- property tests (hypothesis)
floats = st.floats(min_value=-3.0, max_value=3.0, allow_nan=False)
eps = st.floats(min_value=0.05, max_value=0.5)


@settings(max_examples=200, deadline=None)
@given(log_ratio=floats, adv=st.floats(min_value=-2, max_value=2).filter(lambda a: abs(a) > 1e-3),
       eps_low=eps, eps_high=eps)
def test_clip_never_blocks_the_gradient_that_undoes_a_bad_move(log_ratio, adv, eps_low, eps_high):
    """Where the ratio has moved in the direction that makes the objective worse, the gradient survives
    and points back; a zero gradient only happens where the move already improved the objective beyond
    the band, or in the dual-clip region (A < 0, r > c), which bounds the loss on purpose."""
    c = 3.0
    lp = torch.tensor([[log_ratio]], dtype=DT, requires_grad=True)
    terms = A.ppo_clip_terms(torch.zeros(1, 1, dtype=DT), lp, torch.tensor([[adv]], dtype=DT), eps_low, eps_high, c)
    (grad,) = torch.autograd.grad(terms["pg_losses"].sum(), lp)
    r = math.exp(log_ratio)
    worse = (adv > 0 and r < 1 + eps_high) or (adv < 0 and r > 1 - eps_low and r * 1 < c)
    if worse:
        assert grad.item() != 0.0
        assert math.copysign(1, -grad.item()) == math.copysign(1, adv)  # descent moves lp toward A's sign
    else:
        better_beyond_band = (adv > 0 and r > 1 + eps_high) or (adv < 0 and r < 1 - eps_low)
        dual = adv < 0 and r > c
        assert grad.item() == 0.0 and (better_beyond_band or dual or r == c)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(min_value=-5, max_value=5), min_size=2, max_size=12), st.sampled_from(LOSS_AGG_MODES))
def test_ratio_one_gives_minus_advantage_aggregated(advs, mode):
    adv = torch.tensor([advs], dtype=DT)
    lp = -torch.rand(1, len(advs), dtype=DT)
    m = torch.ones_like(adv)
    loss, metrics = A.compute_policy_loss_vanilla(lp, lp, adv, m, mode, ActorConfig(loss_agg_mode=mode))
    assert loss.item() == pytest.approx(A.agg_loss(-adv, m, mode).item(), abs=1e-9)
    assert metrics["actor/pg_clipfrac"] == 0.0 and metrics["actor/ppo_kl"] == 0.0


@settings(max_examples=300, deadline=None)
@given(st.floats(min_value=-20, max_value=20), st.floats(min_value=-20, max_value=0))
def test_k3_is_non_negative_for_unclipped_inputs(d, ref):
    lp = torch.tensor([ref + d], dtype=DT)
    # e^x − x − 1 ≥ 0 exactly, but near x = 0 it is a difference of O(1) numbers: allow a few ulps of 1
    assert A.kl_penalty(lp, torch.tensor([ref], dtype=DT), "k3").item() >= -4 * torch.finfo(DT).eps


def test_a_reading_without_gradients_goes_through_the_model_a_few_rows_at_a_time(monkeypatch):
    """forward_response without gradients cuts the rows into passes of bounded logits (a 151,936-token vocabulary
    would hold 10 GB for a 64 × 256 step at once); the outputs are those of one pass over every row."""
    import ppolab.models as models
    from ppolab.algos.logprob import logit_rows_per_pass
    from ppolab.models import load_tokenizer_and_model
    from ppolab.run.reader import resolve_run

    t = resolve_run("grpo_tiny").step(1).tensors
    ids = torch.cat([t["prompts"], t["responses"]], dim=1)[:7]
    mask = torch.cat([t["prompt_mask"], t["response_mask"].long()], dim=1)[:7]
    model = load_tokenizer_and_model(resolve_run("grpo_tiny").model_path())[1]
    R = t["responses"].shape[1]
    with torch.no_grad():
        whole = models.forward_response(model, ids, mask, R, 0.7, want_entropy=True)
        passes = []
        real = models._forward

        def counting(*args, **kwargs):
            passes.append(args[1].shape[0])
            return real(*args, **kwargs)

        monkeypatch.setattr(models, "_forward", counting)
        monkeypatch.setattr(models, "logit_rows_per_pass", lambda positions, vocab: 3)
        cut = models.forward_response(model, ids, mask, R, 0.7, want_entropy=True)
    assert passes == [3, 3, 1]
    # the same numbers to float32 rounding: a pass of other rows sums its matrix products in another order
    torch.testing.assert_close(cut.log_probs, whole.log_probs, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(cut.entropy, whole.entropy, rtol=1e-6, atol=1e-5)
    assert logit_rows_per_pass(257, 151_936) == 3 and logit_rows_per_pass(50, 29) > 64  # shipped: one pass


def test_a_large_run_replays_a_bounded_number_of_rows(monkeypatch):
    """replay_rows: the whole mini-batch on a shipped run; on a large one (here: a tiny logit budget) the first rows,
    a multiple of rollout.n, and replay_actor_update says how many the mini-batch has."""
    from ppolab import replay
    from ppolab.run.reader import resolve_run

    run = resolve_run("grpo_tiny")
    rows = replay.mini_batch_rows(run)
    assert replay.replay_rows(run) == rows
    n = run.ppo_config().actor_rollout_ref.rollout.n
    per_row = (run.step(1).tensors["responses"].shape[1] + 1) * int(replay.run_models(run).model.config.vocab_size)
    assert replay.replay_rows(run, max_logits=per_row * (2 * n + 1)) == rows[:2 * n]
    assert replay.replay_rows(run, max_logits=1) == rows[:n]  # one group at least


@pytest.mark.slow  # a fresh interpreter opening the explorer: ~12 s, in .ci/run's slow phase
def test_a_process_that_opened_the_explorer_exits_cleanly_while_it_prefetches(tmp_path):
    """Its background replays are stopped at exit: no abort ("terminate called without an active exception")."""
    import subprocess
    import sys

    script = tmp_path / "open_and_exit.py"
    script.write_text("import time\nfrom ppolab.widgets.invariance import invariance_explorer\n"
                      "box = invariance_explorer('ppo_fire_tiny', prefetch=True)\ntime.sleep(0.5)\n"
                      "print('alive', box.prefetch.is_alive())\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "terminate called" not in out.stderr, (out.returncode, out.stderr[-1000:])
    assert "alive True" in out.stdout  # it was still replaying when the script ended


@pytest.mark.slow  # opens the explorer (one replay): in .ci/run's slow phase
def test_closing_the_explorer_stops_its_prefetch():
    from ppolab.widgets.invariance import invariance_explorer

    box = invariance_explorer("ppo_fire_tiny", prefetch=True)
    box.close()
    assert box.stop_prefetch.is_set() and not box.prefetch.is_alive()
