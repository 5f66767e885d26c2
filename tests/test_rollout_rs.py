"""Rejection sampling ``algorithm.rollout_correction.rollout_rs`` (verl `rollout_corr_helper.py`): hand-computed
cases for every option, the threshold spec parsing, the mask semantics, config validation and the trainer wiring."""
import math

import pytest
import torch

import ppolab.algos as A
from ppolab.config import ConfigError, ConfigNotice, load_config

RC = "algorithm.rollout_correction"

# One row, four positions, the last one padding. lr = old − rollout = [0, −0.5, 0.5, −0.3].
OLD = torch.zeros(1, 4)
ROLLOUT = torch.tensor([[0.0, 0.5, -0.5, 0.3]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0]])


def rs(option, threshold, old=OLD, rollout=ROLLOUT, mask=MASK):
    return A.rollout_rejection_mask(old, rollout, mask, option, threshold)


# ====================================================================== token options, by hand
@pytest.mark.parametrize("option, threshold, kept", [
    # k1 = −lr = [0, 0.5, −0.5]; 1.5 means [1/1.5, 1.5]: |k1| ≤ log 1.5 = 0.405 keeps only the first token.
    ("token_k1", 1.5, [1, 0, 0, 0]),
    # "0.9_2.0": log 0.9 = −0.105 ≤ k1 ≤ log 2 = 0.693 keeps k1 = 0 and 0.5, drops −0.5 (asymmetric bounds).
    ("token_k1", "0.9_2.0", [1, 1, 0, 0]),
    ("token_k1", "0.5_2", [1, 1, 1, 0]),
    # k2 = ½lr² = [0, 0.125, 0.125]: an upper bound only.
    ("token_k2", 0.1, [1, 0, 0, 0]),
    ("token_k2", 0.2, [1, 1, 1, 0]),
    # k3 = e^lr − 1 − lr = [0, 0.1065, 0.1487]: 0.12 keeps lr = −0.5 but drops lr = +0.5.
    ("token_k3", 0.12, [1, 1, 0, 0]),
])
def test_token_options_by_hand(option, threshold, kept):
    mask, metrics = rs(option, threshold)
    assert mask.tolist() == [kept]
    rejected = 3 - sum(kept)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(rejected / 3)
    assert metrics[f"rollout_corr/rollout_rs_{option}_masked_fraction"] == pytest.approx(rejected / 3)
    assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == (1.0 if rejected else 0.0)


def test_token_statistics_and_their_metrics():
    _, m = rs("token_k3", 0.12)
    k3 = [0.0, math.exp(-0.5) - 0.5, math.exp(0.5) - 1.5]
    assert m["rollout_corr/rollout_rs_token_k3_mean"] == pytest.approx(sum(k3) / 3, rel=1e-6)
    assert m["rollout_corr/rollout_rs_token_k3_max"] == pytest.approx(k3[2], rel=1e-6)
    assert m["rollout_corr/rollout_rs_token_k3_min"] == 0.0
    assert m["rollout_corr/rollout_rs_token_k3_fraction_high"] == pytest.approx(1 / 3)
    assert m["rollout_corr/rollout_rs_token_k3_fraction_low"] == 0.0
    _, m = rs("token_k1", 1.5)  # k1 reports its log-space bounds: one token above log 1.5, one below −log 1.5
    assert m["rollout_corr/rollout_rs_token_k1_fraction_high"] == pytest.approx(1 / 3)
    assert m["rollout_corr/rollout_rs_token_k1_fraction_low"] == pytest.approx(1 / 3)
    assert m["rollout_corr/rollout_rs_token_k1_mean"] == pytest.approx(0.0, abs=1e-7)


# ====================================================================== sequence options, by hand
# Row 0: lr = [−0.5, −0.5] → k1 = [0.5, 0.5]; row 1: lr = [−0.5, 0.5] → k1 = [0.5, −0.5]; row 2: padding only.
S_OLD = torch.zeros(3, 3)
S_ROLLOUT = torch.tensor([[0.5, 0.5, 9.0], [0.5, -0.5, 9.0], [0.0, 0.0, 0.0]])
S_MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])


@pytest.mark.parametrize("option, threshold, rows_kept", [
    ("seq_sum_k1", 2.0, [0, 1]),     # sums 1.0 and 0.0 against ±log 2 = ±0.693
    ("seq_sum_k1", "0.3_3.0", [1, 1]),  # log 3 = 1.099 admits the sum 1.0
    ("seq_mean_k1", 2.0, [1, 1]),    # means 0.5 and 0.0
    ("seq_mean_k1", "1.0_1.5", [0, 1]),  # [0, 0.405]: mean 0.5 fails
    ("seq_sum_k2", 0.2, [0, 0]),     # both sums are 0.25
    ("seq_sum_k2", 0.3, [1, 1]),
    ("seq_mean_k2", 0.125, [1, 1]),  # both means 0.125 (≤ keeps)
    ("seq_max_k2", 0.1, [0, 0]),     # max 0.125
    ("seq_sum_k3", 0.25, [1, 0]),    # sums 2·0.1065 = 0.213 and 0.1065 + 0.1487 = 0.255
    ("seq_mean_k3", 0.12, [1, 0]),   # means 0.1065 and 0.1276
    ("seq_max_k3", 0.12, [1, 0]),    # maxima 0.1065 and 0.1487
])
def test_sequence_options_keep_or_drop_whole_rows(option, threshold, rows_kept):
    mask, m = A.rollout_rejection_mask(S_OLD, S_ROLLOUT, S_MASK, option, threshold)
    expected = S_MASK.clone()
    for row, keep in enumerate(rows_kept):
        expected[row] *= keep
    assert torch.equal(mask, expected)
    dropped = rows_kept.count(0)
    assert m[f"rollout_corr/rollout_rs_{option}_seq_masked_fraction"] == pytest.approx(dropped / 2)  # valid rows
    assert m["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(dropped / 3)  # over all rows (verl)
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(dropped / 2)  # 2 tokens a row


def test_sequence_metrics_use_sequence_values():
    _, m = A.rollout_rejection_mask(S_OLD, S_ROLLOUT, S_MASK, "seq_sum_k1", 2.0)
    assert m["rollout_corr/rollout_rs_seq_sum_k1_max"] == pytest.approx(1.0)
    assert m["rollout_corr/rollout_rs_seq_sum_k1_min"] == pytest.approx(0.0, abs=1e-7)
    assert m["rollout_corr/rollout_rs_seq_sum_k1_fraction_high"] == 0.5
    assert m["rollout_corr/rollout_rs_seq_sum_k1_seq_fraction_low"] == 0.0
    assert m["rollout_corr/rollout_rs_seq_sum_k1_mean"] == pytest.approx(0.5)  # token-weighted, 2 tokens each


def test_options_must_all_pass_and_duplicates_count_once():
    # lr = old − rollout = [[−0.5, 0], [0, 0.5]] → k1 = [[0.5, 0], [0, −0.5]], k2 = [[0.125, 0], [0, 0.125]].
    old, rollout, mask = torch.zeros(2, 2), torch.tensor([[0.5, 0.0], [0.0, -0.5]]), torch.ones(2, 2)
    alone, _ = A.rollout_rejection_mask(old, rollout, mask, "token_k1", 1.7)  # |k1| ≤ log 1.7 = 0.53: all pass
    assert alone.sum() == 4
    both, metrics = A.rollout_rejection_mask(old, rollout, mask, "token_k1, seq_max_k2,token_k1", "1.7,0.1")
    assert both.tolist() == [[0.0, 0.0], [0.0, 0.0]]  # seq_max_k2 fails both rows (max k2 0.125 > 0.1)
    assert {k for k in metrics if k.endswith("_masked_fraction")} == {
        "rollout_corr/rollout_rs_token_k1_masked_fraction", "rollout_corr/rollout_rs_token_k1_seq_masked_fraction",
        "rollout_corr/rollout_rs_seq_max_k2_masked_fraction", "rollout_corr/rollout_rs_seq_max_k2_seq_masked_fraction",
        "rollout_corr/rollout_rs_masked_fraction", "rollout_corr/rollout_rs_seq_masked_fraction"}
    assert metrics["rollout_corr/rollout_rs_token_k1_masked_fraction"] == 0.0
    assert metrics["rollout_corr/rollout_rs_seq_max_k2_masked_fraction"] == 1.0
    tight, metrics = A.rollout_rejection_mask(old, rollout, mask, "token_k1,seq_max_k2", "0.9_1.1,1.0")
    assert tight.tolist() == [[0.0, 1.0], [1.0, 0.0]]  # 0.5 > log 1.1 and −0.5 < log 0.9; seq_max_k2 passes
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == 0.5
    assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == 1.0


# ====================================================================== the threshold spec
@pytest.mark.parametrize("rs_, threshold, expected", [
    ("token_k1", 2.0, {"token_k1": (0.5, 2.0)}),
    ("token_k1", "2", {"token_k1": (0.5, 2.0)}),
    ("seq_sum_k1", "0.8_1.25", {"seq_sum_k1": (0.8, 1.25)}),
    ("token_k2", 0.01, {"token_k2": (None, 0.01)}),
    ("token_k1,seq_max_k3", "1.5", {"token_k1": (1 / 1.5, 1.5), "seq_max_k3": (None, 1.5)}),  # one shared
    ("token_k1,seq_max_k3", " 0.9_1.1 , 0.02 ", {"token_k1": (0.9, 1.1), "seq_max_k3": (None, 0.02)}),
])
def test_threshold_spec_parsing(rs_, threshold, expected):
    got = A.parse_rollout_rs(rs_, threshold)
    assert list(got) == list(expected)
    for k, (lo, hi) in expected.items():
        assert got[k][1] == pytest.approx(hi) and (got[k][0] is None if lo is None else got[k][0] == pytest.approx(lo))


@pytest.mark.parametrize("rs_, threshold, error, message", [
    ("token_k4", 2.0, ValueError, "Invalid rollout_rs option: token_k4"),
    ("seq_max_k1", 2.0, ValueError, "Invalid rollout_rs option: seq_max_k1"),  # verl has no seq_max_k1
    (" , ", 2.0, ValueError, "at least one valid option"),
    (None, 2.0, ValueError, "non-empty string"),
    ("token_k1", None, ValueError, "rollout_rs_threshold must be provided"),
    ("token_k1", True, TypeError, "string or numeric"),
    ("token_k1", [2.0], TypeError, "string or numeric"),
    ("token_k1", " ", ValueError, "at least one threshold"),
    ("token_k1,token_k2", "1,2,3", ValueError, "either one threshold shared by all options or exactly 2"),
    ("token_k2", "0.1_0.2", ValueError, "must provide a single upper bound without '_'"),
    ("token_k1", "abc", ValueError, "Invalid numeric threshold 'abc' for option 'token_k1'"),
    ("token_k2", -1, ValueError, "must be positive"),
    ("token_k1", "0_2", ValueError, "must be positive"),
    ("token_k1", "2_1.5", ValueError, "lower <= upper"),
    ("token_k1", 0.5, ValueError, "lower <= upper"),  # u = 0.5 means [2, 0.5]
])
def test_threshold_spec_errors(rs_, threshold, error, message):
    with pytest.raises(error, match=message):
        A.parse_rollout_rs(rs_, threshold)


# ====================================================================== mask semantics
def test_padding_and_masked_positions_stay_zero_and_inputs_are_not_modified():
    old, rollout, mask = OLD.clone(), ROLLOUT.clone(), MASK.clone()
    new, _ = A.rollout_rejection_mask(old, rollout, mask, "token_k2", 1e-9)  # drop everything with lr ≠ 0
    assert new.tolist() == [[1.0, 0.0, 0.0, 0.0]] and new.dtype == mask.dtype
    assert torch.equal(mask, MASK) and torch.equal(rollout, ROLLOUT)  # a new tensor; loss_mask is the caller's
    keep_all, m = A.rollout_rejection_mask(old, rollout, mask, "token_k1", 10.0)
    assert torch.equal(keep_all, mask) and m["rollout_corr/rollout_rs_masked_fraction"] == 0.0


def test_log_ratio_is_clamped_at_20():
    old, rollout, mask = torch.tensor([[0.0, 0.0]]), torch.tensor([[-30.0, 0.0]]), torch.ones(1, 2)
    new, m = A.rollout_rejection_mask(old, rollout, mask, "token_k1,token_k2", "1e-9_1e9,1e9")
    assert new.tolist() == [[1.0, 1.0]]  # k1 = −20 (not −30) lies inside [log 1e−9, log 1e9] = ±20.7
    assert m["rollout_corr/rollout_rs_token_k1_min"] == -20.0
    assert m["rollout_corr/rollout_rs_token_k2_max"] == 200.0  # ½·20², not ½·30²


def test_no_valid_token_raises_and_an_empty_batch_passes_through():
    with pytest.raises(ValueError, match="at least one valid token"):
        A.rollout_rejection_mask(OLD, ROLLOUT, torch.zeros_like(MASK), "token_k1", 2.0)
    empty = torch.zeros(0, 4)
    out, m = A.rollout_rejection_mask(empty, empty, empty, "token_k1", 2.0)
    assert out is empty and m == {}


def test_rejection_is_not_differentiable_state():
    old = OLD.clone().requires_grad_(True)
    new, _ = A.rollout_rejection_mask(old, ROLLOUT, MASK, "token_k1", 1.5)
    assert not new.requires_grad


# ====================================================================== config
def test_config_defaults_are_verls_null():
    cfg = load_config("grpo_tiny")
    rc = cfg.algorithm.rollout_correction
    assert (rc.rollout_rs, rc.rollout_rs_threshold, cfg.actor_rollout_ref.rollout.dtype) == (None, None, None)


@pytest.mark.parametrize("overrides, message", [
    ([f"{RC}.rollout_rs=token_k1"], "rollout_rs_threshold must be provided"),
    ([f"{RC}.rollout_rs=token_kl", f"{RC}.rollout_rs_threshold=2"], "option 'token_kl' is not valid (did you mean"),
    ([f"{RC}.rollout_rs=token_k2", f"{RC}.rollout_rs_threshold=0.1_0.2"], "single upper bound"),
    ([f"{RC}.rollout_rs=token_k1,token_k2", f"{RC}.rollout_rs_threshold='1,2,3'"], "exactly 2 thresholds"),
    ([f"{RC}.rollout_rs=token_k1", f"{RC}.rollout_rs_threshold=2",
      "actor_rollout_ref.rollout.calculate_log_probs=false"], "needs actor_rollout_ref.rollout.calculate_log_probs"),
    (["actor_rollout_ref.rollout.dtype=bf16"], "actor_rollout_ref.rollout.dtype='bf16' is not valid"),
    (["actor_rollout_ref.rollout.dtype=float32", "actor_rollout_ref.model.dtype=bfloat16"], "can only lower"),
])
def test_config_errors_name_the_keys(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config("grpo_tiny", overrides)
    assert message in str(e.value)


def test_config_accepts_verl_specs_and_bypass_is_a_notice():
    cfg = load_config("grpo_tiny", [f"{RC}.rollout_rs=token_k1,seq_mean_k3", f"{RC}.rollout_rs_threshold='0.5_2,0.01'"])
    assert cfg.algorithm.rollout_correction.rollout_rs_threshold == "0.5_2,0.01"
    with pytest.warns(ConfigNotice, match="rollout_rs is ignored in bypass mode"):
        load_config("grpo_tiny", [f"{RC}.rollout_rs=token_k1", f"{RC}.rollout_rs_threshold=2",
                                  f"{RC}.bypass_mode=true"])


# ====================================================================== trainer wiring (stage 7)
def test_trainer_rejects_at_stage_7_in_response_mask_but_not_loss_mask():
    from ppolab.train import resolve_config
    from ppolab.trainer import PPOTrainer

    t = PPOTrainer(resolve_config("ppo_gae_tiny", [
        "data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=16", "data.val_max_samples=16",
        "actor_rollout_ref.rollout.dtype=bfloat16", f"{RC}.rollout_rs=token_k1", f"{RC}.rollout_rs_threshold=1.001"]))
    batch, _ = t.balance_batch(t.compute_reward(t.generate_sequences(t.next_prompts())))
    batch, _ = t.compute_old_log_prob(batch)
    batch = t.compute_values(t.compute_ref_log_prob(batch))
    before = batch["response_mask"].clone()
    gap = (batch["old_log_probs"] - batch["rollout_log_probs"]) * before
    assert gap.abs().max() > 1e-3  # the bf16 rollout differs from the fp32 recomputation
    batch, metrics = t.compute_advantage(batch)
    after = batch["response_mask"]
    expected = before * (gap.abs() <= math.log(1.001)).float()  # |k1| ≤ log 1.001 (1/1.001 ↔ −log 1.001)
    assert torch.equal(after, expected) and after.sum() < before.sum()  # tokens were rejected …
    assert torch.equal(batch["loss_mask"], before)  # … and loss_mask, which token-mean counts, still holds them
    share = float(1 - after.sum() / before.sum())
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(share, abs=1e-6)
    assert "rollout_corr/kl" in metrics and "rollout_is_weights" not in batch  # diagnostics, no IS weights
    # rejection changes what is learned, not what is attended: the update's forward still sees every token, so at
    # its first optimizer step (weights = π_old) the log-probs equal old_log_probs on every kept token — also on
    # those after a rejected one (a forward that stopped attending to rejected tokens would differ by nats there)
    assert torch.equal(batch["response_attention_mask"], before)
    m, histories, _ = t.update_actor(batch)
    assert "actor/pg_clipfrac" in m
    first = histories["actor_log_probs"][0]
    rows = ~torch.isnan(first).all(-1)
    kept = after.bool() & rows.unsqueeze(-1)
    assert float((first[kept] - batch["old_log_probs"][kept]).abs().max()) < 1e-5
