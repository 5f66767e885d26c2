"""Rule rewards on tricky strings, the data_source dispatch, and custom reward loading."""

import pytest

from ppolab import rewards
from ppolab.rewards import arith, compute_score, get_reward_fn, gsm8k, load_custom_reward_fn

# (solution_str, ground_truth, strict answer, flexible answer)
EXTRACT = [
    ("#### 85", "85", "85", "85"),
    ("The answer is 85.\n#### 85", "85", "85", "85"),
    ("#### 85 because 37+48=85", "85", "85", "85"),
    ("#### -11", "-11", "-11", "-11"),
    ("#### 1,234", "1234", "1234", "1,234"),
    ("#### 12\n#### 13", "13", "13", "13"),  # the last #### counts
    ("85", "85", None, "85"),  # no ####
    ("I think 37+48 = 85", "85", None, "85"),
    ("3 apples and 4 pears: 7 fruits.", "7", None, "7"),  # several numbers, last wins
    ("####85", "85", None, "85"),  # strict needs the space
    ("#### ", "85", None, None),
    ("", "85", None, None),
    ("no numbers here.", "0", None, None),
    ("ends with a dot 5 .", "5", None, "5"),  # a lone "." is not a number
    ("#### $85", "85", None, "85"),
]


@pytest.mark.parametrize("text,truth,strict,flexible", EXTRACT)
def test_extract_solution(text, truth, strict, flexible):
    assert gsm8k.extract_solution(text, "strict") == strict
    assert gsm8k.extract_solution(text, "flexible") == flexible


@pytest.mark.parametrize("text,truth,strict,flexible", EXTRACT)
def test_gsm8k_score(text, truth, strict, flexible):
    expected_strict = 0.0 if strict is None else (1.0 if strict == truth else 0.1)
    assert gsm8k.compute_score(text, truth, format_score=0.1) == expected_strict
    expected_flex = 0.0 if flexible is None else (1.0 if flexible == truth else 0.1)
    assert gsm8k.compute_score(text, truth, method="flexible", format_score=0.1) == expected_flex


@pytest.mark.parametrize(
    "text,truth,score",
    [
        ("#### 85", "85", 1.0),
        ("#### 085", "85", 1.0),  # integers compare by value
        ("#### -11", "-11", 1.0),
        ("#### 11", "-11", 0.5),  # sign matters
        ("#### -0", "0", 1.0),
        ("#### 84", "85", 0.5),
        ("#### 85.5", "85", 0.5),
        ("85", "85", 0.0),  # right number, no ####
        ("#### 8 5", "85", 0.5),
        ("#### 1\n#### 85", "85", 1.0),
        ("#### 85\n#### 1", "85", 0.5),
        ("#### -", "-5", 0.0),  # a bare sign is no number
        ("#### .", "5", 0.5),  # verl counts "." as a (wrong) strict answer
    ],
)
def test_arith_score(text, truth, score):
    assert arith.compute_score(text, truth, format_score=0.5) == score


def test_format_score_default_is_zero_and_score_is_configurable():
    assert arith.compute_score("#### 1", "2") == 0.0
    assert gsm8k.compute_score("#### 2", "2", score=3.0) == 3.0


def test_only_last_300_chars_are_searched_like_verl():
    text = "#### 85" + "x" * 400
    assert gsm8k.extract_solution(text) is None
    assert gsm8k.extract_solution("x" * 400 + "#### 85") == "85"


def test_dispatch_by_data_source():
    assert compute_score("arith", "#### 085", "85")["score"] == 1.0
    assert compute_score("openai/gsm8k", "#### 085", "85") == 0.0  # gsm8k compares strings
    assert compute_score("openai/gsm8k", "#### 85", "85", {"split": "test"}) == 1.0
    assert compute_score("arith", "#### 84", "85", format_score=0.2)["score"] == 0.2
    with pytest.raises(NotImplementedError, match="custom_reward_function.path"):
        compute_score("lighteval/MATH", "#### 1", "1")
    with pytest.raises(ValueError):
        gsm8k.extract_solution("1", method="loose")


def test_custom_reward_function(tmp_path):
    f = tmp_path / "my_reward.py"
    f.write_text(
        "def my_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):\n"
        "    return {'score': float(solution_str.strip() == ground_truth) + bonus, 'len': len(solution_str)}\n"
    )
    fn = load_custom_reward_fn(f, "my_score")
    assert fn("x", "85", "85") == {"score": 1.0, "len": 2}
    assert get_reward_fn({"path": str(f), "name": "my_score"})("x", "84", "85")["score"] == 0.0
    with_kwargs = get_reward_fn({"path": str(f), "name": "my_score", "reward_kwargs": {"bonus": 0.5}})
    assert with_kwargs("x", "85", "85")["score"] == 1.5
    assert get_reward_fn(None) is rewards.compute_score
    assert get_reward_fn({"path": None, "name": "compute_score"}) is rewards.compute_score


def test_custom_reward_errors_name_the_config_keys(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"custom_reward_function\.path.*nope\.py"):
        get_reward_fn({"path": str(tmp_path / "nope.py"), "name": "compute_score"})
    f = tmp_path / "r.py"
    f.write_text("def compute_score(*a, **k):\n    return 0.0\n")
    with pytest.raises(AttributeError, match=r"custom_reward_function\.name.*'missing'"):
        load_custom_reward_fn(f, "missing")
    assert load_custom_reward_fn(f)("arith", "#### 1", "1") == 0.0


def test_custom_reward_from_omegaconf(tmp_path):
    omegaconf = pytest.importorskip("omegaconf")
    f = tmp_path / "r2.py"
    f.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None, k=1):\n    return k\n")
    cfg = omegaconf.OmegaConf.create({"path": str(f), "name": "compute_score", "reward_kwargs": {"k": 7}})
    assert get_reward_fn(cfg)("arith", "", "") == 7


def test_arith_returns_verl_dict_with_two_components_for_gdpo():
    from ppolab.rewards import compute_score

    assert compute_score("arith", "12 + 3 = 15\n#### 15", "15") == {"score": 1.0, "acc": 1.0, "format": 1.0}
    assert compute_score("arith", "#### 14", "15", format_score=0.1) == {"score": 0.1, "acc": 0.0, "format": 1.0}
    assert compute_score("arith", "15", "15") == {"score": 0.0, "acc": 0.0, "format": 0.0}
    tool = "#### 3<|/tool_response|>so #### 15"
    assert compute_score("arith_tool", tool, "15") == {"score": 1.0, "acc": 1.0, "format": 1.0}
