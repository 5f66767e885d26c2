"""ppolab.widgets.gradients: the per-token gradient weight w = −∂L/∂log π ÷ share, by autograd through the registry
functions, checked against closed forms re-derived here by hand; the recorded-step weights and the lab 06 explorer."""
from __future__ import annotations

import math

import pytest
import torch

from ppolab.algos import POLICY_LOSS_REGISTRY
from ppolab.config import ActorConfig
from ppolab.widgets.common import actor_config, optimizer_step_batch, resolve_run, step_tensors
from ppolab.widgets.gradients import (
    RATIO_GRID,
    gradient_gallery,
    gradient_weights,
    mode_config,
    mode_curves,
    recorded_weights,
)

# ratios on both sides of every kink below (0.85, 1.1, 2.0), none on one
R = torch.tensor([0.3, 0.6, 0.84, 0.86, 0.95, 1.0, 1.05, 1.09, 1.11, 1.5, 1.99, 2.01, 2.4], dtype=torch.float64)
CFG = ActorConfig(clip_ratio_low=0.15, clip_ratio_high=0.1, clip_ratio_c=2.0)


#: The recorded step and optimizer step of ppo_fire_tiny where the clip and the dual clip both bind (lab 05's
#: write-the-metric case, DUAL_STEP / DUAL_CODE of ppolab.exercises.lab05).
STEP, OPT = 21, 13


@pytest.fixture(scope="module")
def fire():
    run = resolve_run("ppo_fire_tiny")
    return run, actor_config(run)


@pytest.mark.parametrize("adv", [1.0, 0.37, -1.0, -2.5])
def test_vanilla_weight_is_the_closed_form(adv):
    w = gradient_weights("vanilla", R, adv, CFG, old_prob=0.3)
    if adv > 0:  # clipped (zero gradient) only on the right: r > 1 + ε_high
        off = R > 1.1
    else:  # clipped on the left (r < 1 − ε_low), and the dual clip past c
        off = (R < 0.85) | (R > 2.0)
    expected = torch.where(off, torch.zeros_like(R), adv * R)
    torch.testing.assert_close(w, expected, rtol=1e-12, atol=1e-12)
    assert (w[~off] != 0).all()


def test_dual_clip_region_is_only_for_negative_advantages():
    r = torch.tensor([1.5, 2.5], dtype=torch.float64)  # between 1+ε_high and c, then past c
    neg = gradient_weights("vanilla", r, -1.0, CFG, old_prob=0.3)
    pos = gradient_weights("vanilla", r, 1.0, CFG, old_prob=0.3)
    assert neg.tolist() == [-1.5, 0.0]  # unclipped until c = 2, then the dual clip zeroes it
    assert pos.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("mode", ["vanilla", "cispo", "gpg", "dro", "dppo_tv"])
def test_weight_does_not_depend_on_aggregation_or_batch_size(mode):
    """The share s_t is divided out: token-sum, token-mean, seq-mean-* give the same w, for 1 or 13 tokens."""
    ws = []
    for agg in ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        cfg = ActorConfig(loss_agg_mode=agg, clip_ratio_c=2.0)
        ws.append(gradient_weights(mode, R, -0.7, cfg, old_prob=0.3))
        ws.append(torch.cat([gradient_weights(mode, R[i:i + 1], -0.7, cfg, old_prob=0.3) for i in range(len(R))]))
    for w in ws[1:]:
        torch.testing.assert_close(w, ws[0], rtol=1e-12, atol=1e-12)


def test_other_closed_forms():
    cfg = ActorConfig(clip_ratio=0.2, tau_pos=1.0, tau_neg=1.05)
    cfg.policy_loss.dro_beta = 0.3
    for a in (1.5, -0.5):
        torch.testing.assert_close(gradient_weights("cispo", R, a, cfg, old_prob=0.3), a * R.clamp(0.8, 1.2))
        torch.testing.assert_close(gradient_weights("gpg", R, a, cfg, old_prob=0.3), torch.full_like(R, a))
        torch.testing.assert_close(gradient_weights("dro", R, a, cfg, old_prob=0.3), a - 0.3 * torch.log(R))
        tau = 1.0 if a > 0 else 1.05  # d/dlp of −A·σ(τ(r−1))·4/τ
        torch.testing.assert_close(gradient_weights("sapo", R, a, cfg, old_prob=0.3),
                                   a * R / torch.cosh(tau * (R - 1) / 2) ** 2)
    # dppo_tv at π_old = 0.3, δ = 0.2: A > 0 kept while 0.3·(r − 1) ≤ 0.2, weight A·min(r, c = 3)
    w = gradient_weights("dppo_tv", R, 1.0, cfg, old_prob=0.3)
    torch.testing.assert_close(w, torch.where(0.3 * (R - 1) <= 0.2, R.clamp(max=3.0), torch.zeros_like(R)))


def test_every_mode_gives_finite_weights_on_the_grid(fire):
    _, base = fire
    for cfg in (base, ActorConfig()):
        for mode in POLICY_LOSS_REGISTRY:
            for j, (label, ws) in enumerate(mode_curves(mode, cfg).items()):
                for sign, w in ws.items():
                    assert w.shape == RATIO_GRID.shape and torch.isfinite(w).all(), (mode, label, sign)
                    # no mode's default branch is silent everywhere (clip_cov's drawn branch is, by design)
                    assert j > 0 or (w != 0).any(), (mode, label, sign)


def test_branches_of_the_batch_dependent_modes(fire):
    _, base = fire
    cov = mode_curves("clip_cov", base)
    assert list(cov) == ["not drawn", "drawn (loss zeroed)"]
    assert (cov["drawn (loss zeroed)"]["pos"] == 0).all() and (cov["drawn (loss zeroed)"]["neg"] == 0).all()
    # not drawn: the plain clip, without vanilla's dual clip
    no_dual = mode_config(base, "vanilla")
    no_dual.clip_ratio_c = 1e9
    torch.testing.assert_close(cov["not drawn"]["neg"], gradient_weights("vanilla", RATIO_GRID, -1.0, no_dual))
    kl = mode_curves("kl_cov", base)
    torch.testing.assert_close(kl["not selected"]["pos"], RATIO_GRID)
    penalised = RATIO_GRID - 0.1 * torch.sign(torch.log(RATIO_GRID))  # A·r − ppo_kl_coef·sign(log r)
    torch.testing.assert_close(kl["selected (|log r| penalty)"]["pos"], penalised)
    byp = mode_curves("bypass_mode", base)
    assert list(byp)[0] == "loss_type=ppo_clip"  # the run's own loss_type first
    torch.testing.assert_close(byp["loss_type=ppo_clip"]["neg"], gradient_weights("vanilla", RATIO_GRID, -1.0, base))
    # reinforce: A times the sequence IS weight truncated at rollout_is_threshold = 2
    torch.testing.assert_close(byp["loss_type=reinforce"]["pos"], RATIO_GRID.clamp(max=2.0))


def test_invalid_inputs_raise():
    with pytest.raises(ValueError, match="probability"):
        gradient_weights("vanilla", [3.0], 1.0, old_prob=0.4)
    with pytest.raises(ValueError, match="not registered"):
        gradient_weights("reinforce", [1.0], 1.0)
    with pytest.raises(ValueError, match="no branch"):
        gradient_weights("vanilla", [1.0], 1.0, branch="selected")


@pytest.mark.parametrize("mode", sorted(POLICY_LOSS_REGISTRY))
def test_recorded_weights_are_finite_and_token_modes_sit_on_their_curve(fire, mode):
    run, base = fire
    rec = step_tensors(run, STEP)
    b = optimizer_step_batch(rec, OPT)
    rw = recorded_weights(mode, b, base, rec.tensors["rollout_log_probs"][b["rows"]].double())
    assert rw["w"].numel() > 50 and torch.isfinite(rw["w"]).all() and torch.isfinite(rw["x"]).all()
    if mode not in ("geo_mean", "clip_cov", "kl_cov"):
        # batch autograd on the real (rows, T) tensors == the one-token curve at (x, a): the share is right
        assert int(rw["off_curve"].sum()) == 0, mode


def test_recorded_vanilla_by_hand(fire):
    run, base = fire
    b = optimizer_step_batch(step_tensors(run, STEP), OPT)
    rw = recorded_weights("vanilla", b, base)
    r, a, w = rw["x"], rw["a"], rw["w"]
    zero = ((a > 0) & (r > 1.07)) | ((a < 0) & ((r < 0.93) | (r > base.clip_ratio_c)))
    assert int(zero.sum()) > 0 and int(((a < 0) & (r > base.clip_ratio_c)).sum()) == 1  # the clips bind here
    torch.testing.assert_close(w, torch.where(zero, torch.zeros_like(w), a * r), rtol=1e-9, atol=1e-12)


def test_recorded_covariance_picks(fire):
    run, base = fire
    # clip_cov draws among the tokens whose covariance lies in (clip_cov_lb, clip_cov_ub) = (1, 5), kl_cov takes the
    # top ones: the first recorded optimizer step where both select (one without candidates zeroes nothing)
    for s, k in ((s, k) for s in run.steps for k in range(step_tensors(run, s).tensors["actor_log_probs"].shape[0])):
        b = optimizer_step_batch(step_tensors(run, s), k)
        cov, kl = recorded_weights("clip_cov", b, base, seed=0), recorded_weights("kl_cov", b, base)
        if cov["off_curve"].any() and kl["off_curve"].any():
            break
    assert int(cov["off_curve"].sum()) == 1, (s, k)  # k = max(1, int(2e-4·N)) = 1 drawn token, zeroed
    assert (cov["w"][cov["off_curve"]] == 0).all() and (cov["reference"][cov["off_curve"]] != 0).all()
    again = recorded_weights("clip_cov", b, base, seed=0)
    assert torch.equal(cov["w"], again["w"])  # seeded draw: reproducible
    sel = kl["off_curve"]
    assert int(sel.sum()) == 1
    torch.testing.assert_close(kl["w"][sel], kl["a"][sel] * kl["x"][sel] - 0.1 * torch.sign(torch.log(kl["x"][sel])))


def test_recorded_geo_mean_weights_share_one_ratio_per_sequence(fire):
    run, base = fire
    b = optimizer_step_batch(step_tensors(run, STEP), OPT)
    rw = recorded_weights("geo_mean", b, base)
    pushed = rw["w"] != 0
    assert pushed.any() and (~pushed).any()
    for row in rw["row"][pushed].unique():
        sel = pushed & (rw["row"] == row)
        rho = rw["w"][sel] / rw["a"][sel]  # Ā_i·ρ_i / Ā_i: one clipped geometric-mean ratio per sequence
        assert torch.allclose(rho, rho[0].expand_as(rho), rtol=1e-9) and rho[0] > 0
        if (b["advantages"][b["rows"] == row] * b["response_mask"][b["rows"] == row] >= 0).all():
            assert rho[0] <= math.exp(0.07) + 1e-12  # all tokens A ≥ 0: every log-ratio clipped at +ε_high


def test_gallery_builds_and_controls_update_the_figures():
    g = gradient_gallery("ppo_fire_tiny", step=15, opt_step=15)
    assert set(g.controls) == {"mode", "opt_step", "old_prob"} and set(g.figures) == {"mode", "all_modes"}
    assert len(g.figures["all_modes"].layout.annotations) == len(POLICY_LOSS_REGISTRY)
    fig = g.figures["mode"]
    assert g.state["mode"] == "vanilla" and g.state["n_zero"] > 0
    y_vanilla, x_dots = list(fig.data[0].y), list(fig.data[2].x)

    g.controls["mode"].value = "cispo"
    assert g.state["mode"] == "cispo" and g.state["n_zero"] == 0  # cispo never switches a token off
    assert list(fig.data[0].y) != y_vanilla and "cispo" in fig.layout.title.text

    g.controls["opt_step"].value = 3
    assert g.state["opt_step"] == 3 and list(fig.data[2].x) != x_dots

    g.controls["mode"].value = "dppo_tv"
    before = list(fig.data[0].y)
    g.controls["old_prob"].value = 0.1
    assert list(fig.data[0].y) != before  # dppo's cut moves with π_old


def test_gallery_draws_a_bounded_sample_and_says_so(monkeypatch):
    """On a run with many tokens the scatter draws at most ``limit`` points a trace (evenly spaced, the title says
    so) while every count uses all the tokens."""
    import functools

    import ppolab.widgets.common as common
    import ppolab.widgets.gradients as gallery

    monkeypatch.setattr(gallery, "drawn", functools.partial(common.drawn, limit=20))
    g = gallery.gradient_gallery("ppo_fire_tiny", step=15, opt_step=15)
    fig = g.figures["mode"]
    shown = sum(len(fig.data[i].x) for i in (2, 3, 6, 7))
    assert all(len(fig.data[i].x) <= 20 for i in (2, 3, 6, 7)) and shown < g.state["n_tokens"]
    assert "showing" in fig.layout.title.text and str(g.state["n_tokens"]) in fig.layout.title.text
    full = gallery.recorded_weights("vanilla", optimizer_step_batch(g.record, 15),
                                    actor_config(resolve_run("ppo_fire_tiny")))
    assert g.state["n_tokens"] == full["w"].numel() and g.state["n_zero"] == int((full["w"] == 0).sum())
    custom = fig.data[2].customdata  # hover: row, position, A, w of each drawn token
    assert len(custom) == len(fig.data[2].x) and all(c[2] > 0 for c in custom)
