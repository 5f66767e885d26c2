"""The multi-turn tool agent rollout (issue 8): the calculator, observation masking, the turn limit, and one
GRPO step through the trainer with the shipped calculator agent (CPU, seconds)."""
from types import SimpleNamespace

import pytest
import torch

from ppolab.models import REPO_ROOT, load_tokenizer_and_model
from ppolab.models import forward_response
from ppolab.rollout import SamplingParams
from ppolab.rollout.agent import StandaloneModels, ToolAgentRollout, evaluate_tool_agent
from ppolab.tokenizer import TOOL_CALL, TOOL_CALL_END, TOOL_RESPONSE, TOOL_RESPONSE_END
from ppolab.tools import MAX_ABS, calculator
from ppolab.worker import ActorWorker

TOOL_MODEL = REPO_ROOT / "data" / "models" / "tiny-arith-tool"
TOOL_DATA = REPO_ROOT / "data" / "arith_tool"


# ====================================================================== the calculator
@pytest.mark.parametrize("expr, result", [
    ("37*48", "1776"), ("2+3*4", "14"), ("(2+3)*4", "20"), ("-5*-3", "15"), ("1-(2-3)", "2"), (" 12 * 3 ", "36"),
    ("0*99", "0"), ("10-99", "-89"), ("999999*1000000", "999999000000"),
])
def test_calculator_evaluates_integer_arithmetic(expr, result):
    assert calculator(expr) == result


@pytest.mark.parametrize("expr, error", [
    ("", "error: empty"), ("   ", "error: empty"), ("37*", "error: syntax"), ("(1+2", "error: syntax"),
    ("1+2)", "error: syntax"), ("3 4", "error: syntax"), ("1/2", "error: syntax"), ("2**8", "error: syntax"),
    ("__import__('os')", "error: syntax"), ("<|tool_call|>1+1", "error: syntax"), ("1e5", "error: syntax"),
    ("٣+1", "error: syntax"),  # a non-ASCII digit
    ("1" * 65, "error: too long"), ("9" * 13, "error: too big"), ("999999*999999*9", "error: too big"),
    ("(" * 20 + "1" + ")" * 20, "error: too deep"), ("-" * 30 + "1", "error: too deep"),
])
def test_calculator_answers_bad_calls_with_an_error_and_never_raises(expr, error):
    assert calculator(expr) == error


def test_calculator_rejects_non_strings_and_bounds_every_value():
    assert calculator(None) == "error: syntax"
    assert calculator(f"{MAX_ABS // 2}*2") == str(MAX_ABS)
    assert calculator(f"{MAX_ABS // 2}*2+1") == "error: too big"
    assert calculator(f"-{MAX_ABS // 2}*2-1") == "error: too big"


# ====================================================================== the rollout on the shipped agent
@pytest.fixture(scope="module")
def agent():
    tok, model = load_tokenizer_and_model(TOOL_MODEL)
    return tok, model


def engine_for(agent, turns=2, tool_len=16):
    tok, model = agent
    return ToolAgentRollout(StandaloneModels(tok, model),
                            SimpleNamespace(max_assistant_turns=turns, max_tool_response_length=tool_len))


@pytest.fixture(scope="module")
def prompts(agent):
    from ppolab.data import load_rl_dataset

    return load_rl_dataset(TOOL_DATA / "test.parquet", agent[0], 32)[:8]


@pytest.fixture(scope="module")
def sampled(agent, prompts):
    engine = engine_for(agent)
    torch.manual_seed(0)
    out = engine.generate([p["input_ids"] for p in prompts], 4, SamplingParams(1.0, 1.0, -1, True), 40)
    return engine, out


def spans(mask_row):
    """[(start, end)] of the runs of response_mask = 0 inside the attended part."""
    out, start = [], None
    for j, m in enumerate(mask_row.tolist() + [1.0]):
        if m == 0 and start is None:
            start = j
        elif m != 0 and start is not None:
            out.append((start, j))
            start = None
    return out


def test_observations_are_the_calculators_answer_attended_but_masked(agent, sampled):
    tok = agent[0]
    _, out = sampled
    ids = tok.convert_tokens_to_ids
    assert out.response_attention_mask is not None and out.num_tool_calls.sum() > 0  # the agent uses its tool
    n_obs = 0
    for i in range(len(out.responses)):
        length = int(out.response_attention_mask[i].sum())
        assert (out.response_attention_mask[i, :length].eq(1).all()
                and out.response_attention_mask[i, length:].eq(0).all())
        assert out.response_mask[i, length:].eq(0).all() and out.rollout_log_probs[i, length:].eq(0).all()
        assert out.responses[i, length:].eq(tok.pad_token_id).all()
        row = out.responses[i, :length].tolist()
        obs = spans(out.response_mask[i, :length])
        assert len(obs) == int(out.num_tool_calls[i])
        for start, end in obs:
            n_obs += 1
            assert out.rollout_log_probs[i, start:end].eq(0).all()
            # The call is the policy's text between the last <|tool_call|> and <|/tool_call|> before it.
            assert row[start - 1] == ids(TOOL_CALL_END)
            before = row[:start - 1]
            call = before[len(before) - before[::-1].index(ids(TOOL_CALL)):] if ids(TOOL_CALL) in before else before
            answer = calculator(tok.decode(call))
            expected = [ids(TOOL_RESPONSE), *tok(answer, add_special_tokens=False)["input_ids"][:16],
                        ids(TOOL_RESPONSE_END)]
            assert row[start:end] == expected
        policy = out.response_mask[i, :length].bool()
        assert (out.rollout_log_probs[i, :length][policy] < 0).all()  # sampled tokens have real log-probs
    assert n_obs > 0


def test_rollout_log_probs_match_the_trainers_forward_over_the_spliced_trajectory(agent, sampled):
    """Positions and attention of the spliced context are the ones the trainer rebuilds: prompt_mask ‖
    response_attention_mask, so the update's log π of the policy tokens equals the engine's own."""
    _, model = agent
    _, out = sampled
    ids = torch.cat([out.prompts, out.responses], dim=1)
    mask = torch.cat([out.prompt_mask, out.response_attention_mask.long()], dim=1)
    with torch.no_grad():
        lp = forward_response(model, ids, mask, out.responses.shape[1], 1.0).log_probs
    policy = out.response_mask.bool()
    torch.testing.assert_close(lp[policy], out.rollout_log_probs[policy], atol=2e-4, rtol=0)


def test_greedy_evaluation_reports_accuracy_and_tool_use(agent, prompts):
    e = evaluate_tool_agent(agent[1], agent[0], prompts, max_assistant_turns=2, max_response_length=40)
    assert e["n"] == 8 and 0.0 <= e["tool_use_rate"] <= 1.0 and 0.0 <= e["accuracy"] <= 1.0


# ====================================================================== the loop's rules, with a scripted policy
def scripted(engine, turns_text):
    """Replace the model by a script: turn k of every row writes ``turns_text[k]`` (token strings), log-prob -1."""
    tok = engine.tokenizer

    def encode(parts):
        return [tok.convert_tokens_to_ids(p) if p.startswith("<") else tok(p, add_special_tokens=False)["input_ids"][0]
                for p in parts]

    def fake_turn(model, contexts, max_new_tokens, sampling):
        tokens = []
        for ctx in contexts:
            k = ctx.count(engine.call_end_id)  # turns already taken
            tokens.append(encode(turns_text[min(k, len(turns_text) - 1)])[:max_new_tokens])
        return tokens, [[-1.0] * len(t) for t in tokens]

    engine._generate_turn = fake_turn
    return engine


CALL = [TOOL_CALL, "1", "2", "*", "3", TOOL_CALL_END]  # 12*3
ANSWER = ["#", "#", "#", "#", " ", "3", "6", "<eos>"]


def run(engine, max_len=60):
    return engine.generate([[2, 5, 23]], 2, SamplingParams(), max_len)


def test_turn_limit_one_executes_no_call(agent):
    out = run(scripted(engine_for(agent, turns=1), [CALL, ANSWER]))
    assert out.num_tool_calls.tolist() == [0, 0] and out.num_turns.tolist() == [1, 1]
    assert out.response_mask[0].sum() == len(CALL) and out.response_attention_mask[0].sum() == len(CALL)


def test_a_call_on_the_last_turn_gets_no_observation(agent):
    tok = agent[0]
    out = run(scripted(engine_for(agent, turns=2), [CALL, CALL, ANSWER]))  # calls twice, never answers
    assert out.num_tool_calls.tolist() == [1, 1] and out.num_turns.tolist() == [2, 2]
    row = out.responses[0][out.response_attention_mask[0].bool()].tolist()
    obs = [tok.convert_tokens_to_ids(TOOL_RESPONSE), *tok("36", add_special_tokens=False)["input_ids"],
           tok.convert_tokens_to_ids(TOOL_RESPONSE_END)]
    assert row == engine_for(agent).tokenizer.convert_tokens_to_ids(CALL) + obs + tok.convert_tokens_to_ids(CALL)
    assert spans(out.response_mask[0][: len(row)]) == [(len(CALL), len(CALL) + len(obs))]
    out = run(scripted(engine_for(agent, turns=3), [CALL, CALL, ANSWER]))
    assert out.num_tool_calls.tolist() == [2, 2] and out.num_turns.tolist() == [3, 3]
    assert tok.decode(out.responses[0], skip_special_tokens=True).endswith("#### 36")


@pytest.mark.parametrize("call, error", [
    ([TOOL_CALL, "1", "+", TOOL_CALL_END], "error: syntax"),
    (["1", "2", TOOL_CALL_END], "12"),  # no opening marker: the whole turn is the call
    (["#", "#", TOOL_CALL_END], "error: syntax"),
    ([TOOL_CALL, TOOL_CALL_END], "error: empty"),
    ([TOOL_CALL, *"9999999*999999", TOOL_CALL_END], "error: too big"),
])
def test_malformed_calls_get_an_error_observation(agent, call, error):
    tok = agent[0]
    out = run(scripted(engine_for(agent, turns=2, tool_len=32), [call, ANSWER]))
    length = int(out.response_attention_mask[0].sum())
    (start, end), = spans(out.response_mask[0, :length])
    assert tok.decode(out.responses[0, start + 1:end - 1]) == error
    assert out.rollout_log_probs[0, start:end].eq(0).all() and out.rollout_log_probs[0, :start].eq(-1).all()


def test_a_tool_that_raises_still_answers_and_long_answers_are_truncated(agent):
    engine = engine_for(agent, turns=2, tool_len=3)
    engine.tool = lambda text: 1 / 0
    out = run(scripted(engine, [CALL, ANSWER]))
    obs = out.responses[0, len(CALL) + 1:len(CALL) + 4]
    assert agent[0].decode(obs) == "err" and out.responses[0, len(CALL) + 4] == engine.response_end_id


def test_the_response_length_limit_truncates_everything(agent):
    for max_len in (1, 4, 7, 9, 12):
        out = run(scripted(engine_for(agent, turns=3), [CALL, CALL, ANSWER]), max_len=max_len)
        assert out.responses.shape[1] <= max_len and out.response_attention_mask.sum(-1).eq(max_len).all()


def test_the_plain_tokenizer_is_refused(agent):
    from ppolab.models import SHIPPED_MODEL

    tok, model = load_tokenizer_and_model(SHIPPED_MODEL)
    with pytest.raises(ValueError, match="tool tokens"):
        ToolAgentRollout(StandaloneModels(tok, model),
                         SimpleNamespace(max_assistant_turns=2, max_tool_response_length=8))


# ====================================================================== through the trainer
SMALL = [
    "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "data.val_max_samples=8", "trainer.test_freq=2", "trainer.record_freq=1",
]


def test_the_preset_validates_without_notices():
    import warnings

    from ppolab.config import ConfigNotice, list_presets, load_config, validate

    assert "grpo_tool_tiny" in list_presets()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigNotice)
        cfg = load_config("grpo_tool_tiny")
    assert validate(cfg) == []
    r = cfg.actor_rollout_ref.rollout
    assert (r.multi_turn.enable, r.agent.default_agent_loop, r.multi_turn.max_assistant_turns, r.n) == (
        True, "tool_agent", 2, 8)
    a = cfg.actor_rollout_ref.actor
    assert (a.use_kl_loss, a.kl_loss_type, a.kl_loss_coef, cfg.algorithm.adv_estimator) == (
        True, "low_var_kl", 0.001, "grpo")
    assert cfg.actor_rollout_ref.model.path == str(TOOL_MODEL)


@pytest.fixture(scope="module")
def tool_trainer():
    from ppolab.train import resolve_config
    from ppolab.trainer import PPOTrainer

    torch.manual_seed(0)
    t = PPOTrainer(resolve_config("grpo_tool_tiny", SMALL))
    batch = t.compute_reward(t.generate_sequences(t.next_prompts()))
    batch, _ = t.balance_batch(batch)
    batch, _ = t.compute_old_log_prob(batch)
    batch = t.compute_ref_log_prob(batch)
    batch, _ = t.compute_advantage(batch)
    return t, batch


def observation_positions(batch):
    return batch["response_attention_mask"].bool() & ~batch["response_mask"].bool()


def test_the_preset_builds_the_tool_agent_and_its_batch_masks_observations(tool_trainer):
    t, batch = tool_trainer
    assert isinstance(t.rollout, ToolAgentRollout) and t.rollout.max_turns == 2
    obs = observation_positions(batch)
    assert obs.any()  # 16 sampled trajectories of the shipped agent call the tool
    assert batch["loss_mask"].equal(batch["response_mask"])
    for key in ("advantages", "token_level_scores", "rollout_log_probs"):
        assert batch[key][obs].eq(0).all(), key
    # The score sits on the last policy token, after any observation.
    last = batch["token_level_scores"].ne(0).float().argmax(-1)
    scored = batch["token_level_scores"].ne(0).any(-1)
    assert batch["response_mask"][scored, last[scored]].eq(1).all()


def test_observation_tokens_contribute_nothing_to_the_actor_update(tool_trainer):
    """Scrambling old log-probs, ref log-probs and advantages at observation positions leaves the update unchanged."""
    t, batch = tool_trainer
    params = t.models.actor_parameters()
    start = [p.detach().clone() for p in params]
    obs = observation_positions(batch)

    def update(b):
        with torch.no_grad():
            for p, s in zip(params, start):
                p.copy_(s)
        worker = ActorWorker(t.actor.config, t.models, temperature=t.actor.temperature, rollout_n=t.actor.rollout_n,
                             optimizer=torch.optim.SGD(params, lr=1.0))
        metrics, *_ = worker.update(b)
        return [p.detach().clone() for p in params], metrics

    try:
        clean, m1 = update(batch)
        scrambled = type(batch)(dict(batch.tensors), dict(batch.lists))
        g = torch.Generator().manual_seed(1)
        for key in ("old_log_probs", "ref_log_prob", "advantages"):
            noise = torch.randn(batch[key].shape, generator=g) * 5
            scrambled[key] = torch.where(obs, noise, batch[key])
        dirty, m2 = update(scrambled)
        control = type(batch)(dict(batch.tensors), dict(batch.lists))  # the same noise on policy tokens matters
        control["advantages"] = torch.where(batch["response_mask"].bool(), noise, batch["advantages"])
        moved, _ = update(control)
    finally:
        with torch.no_grad():
            for p, s in zip(params, start):
                p.copy_(s)
    assert any(not torch.equal(c, s) for c, s in zip(clean, start))  # the update did something
    for c, d in zip(clean, dirty):
        torch.testing.assert_close(c, d, atol=1e-7, rtol=0)
    assert m1["actor/pg_loss"] == pytest.approx(m2["actor/pg_loss"], abs=1e-7)
    assert any(not torch.allclose(c, m, atol=1e-5) for c, m in zip(clean, moved))


def test_one_training_step_end_to_end(tool_trainer):
    t, _ = tool_trainer
    metrics, batch, *_ = t.step()
    assert "response_attention_mask" in batch.tensors and observation_positions(batch).any()
    assert all(torch.isfinite(torch.as_tensor(v)) for k, v in metrics.items() if isinstance(v, float))
    val = t.validate()
    assert 0.0 <= val["val/accuracy"] <= 1.0


def test_mask_viewer_colours_tool_observations(tool_trainer):
    from ppolab.widgets.masks import CATEGORIES, token_categories

    _, batch = tool_trainer
    cats = token_categories(SimpleNamespace(tensors=batch.tensors))
    P = batch["prompts"].shape[1]
    assert CATEGORIES[4] == "tool observation"
    assert cats[:, P:].eq(4).equal(observation_positions(batch) & ~batch["is_pad"][:, None])
