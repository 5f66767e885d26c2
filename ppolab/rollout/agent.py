"""The multi-turn tool agent loop (verl's ``tool_agent``), on top of Hugging Face ``generate``.

One trajectory, as the trainer sees it (tokens of the tool-enabled tokenizer, ``ppolab.tokenizer``)::

    <|tool_call|>37*48<|/tool_call|>  <|tool_response|>1776<|/tool_response|>  #### 1776<eos>
    └──── policy, turn 1 ───────────┘ └──────── observation (environment) ────┘ └ policy, turn 2 ┘
    response_mask            1 … 1                 0 … 0                           1 … 1
    response_attention_mask  1 … 1                 1 … 1                           1 … 1
    rollout_log_probs        log π                 0                               log π

Each assistant turn is one batched ``generate`` that stops at EOS or at ``<|/tool_call|>``. A row that
stopped at a call with turns left gets the tool's answer spliced in (``max_tool_response_length`` tokens
at most between the response markers) and goes on generating; a row stops at EOS, at the turn limit (a
call written on the last turn is not executed) or when the response reaches ``max_response_length``
(truncated there). Observation tokens are attended to but carry no loss: response_mask = 0 keeps them
out of the policy, KL and entropy terms and out of the token count (chapter §9; verl `forward_backward_batch`).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from ppolab.rewards import score_responses
from ppolab.rollout.base import RolloutOutput, SamplingParams, eos_token_ids, left_pad
from ppolab.rollout.hf import generate_tokens
from ppolab.tokenizer import TOOL_CALL, TOOL_CALL_END, TOOL_RESPONSE, TOOL_RESPONSE_END
from ppolab.tools import calculator


class ToolAgentRollout:
    """Samples multi-turn trajectories with a calculator tool; the engine of ``multi_turn.enable=true`` +
    ``agent.default_agent_loop=tool_agent``.

    ``multi_turn`` needs ``max_assistant_turns`` (≥ 1) and ``max_tool_response_length``. After each
    ``generate`` the per-row counts of the last call are in ``last_num_tool_calls`` (executed calls) and
    ``last_num_turns`` (assistant turns); the returned RolloutOutput carries them as attributes too.
    """

    def __init__(self, models, multi_turn, tool: Callable[[str], str] = calculator, chunk_size: int = 512):
        self.models = models
        self.tokenizer = tok = models.tokenizer
        self.max_turns = int(multi_turn.max_assistant_turns or 1)
        self.max_tool_response_length = int(multi_turn.max_tool_response_length)
        self.tool = tool
        self.chunk_size = chunk_size
        ids = {t: tok.convert_tokens_to_ids(t) for t in (TOOL_CALL, TOOL_CALL_END, TOOL_RESPONSE, TOOL_RESPONSE_END)}
        missing = [t for t, i in ids.items() if i is None or i == tok.unk_token_id]
        if missing:
            raise ValueError(f"the tool agent loop needs the tool tokens {missing} in the model's tokenizer; use a "
                             "tool-enabled model such as data/models/tiny-arith-tool (ppolab.tokenizer, tools=True)")
        self.call_id, self.call_end_id = ids[TOOL_CALL], ids[TOOL_CALL_END]
        self.response_id, self.response_end_id = ids[TOOL_RESPONSE], ids[TOOL_RESPONSE_END]
        self.eos_ids = eos_token_ids(models.model, tok)
        self.stop_ids = self.eos_ids + [self.call_end_id]
        self.last_num_tool_calls: torch.Tensor | None = None
        self.last_num_turns: torch.Tensor | None = None

    def sync_weights(self) -> None:
        """Nothing to do: generation runs on the very model the optimizer updates."""

    # ------------------------------------------------------------------ the environment side
    def observation(self, turn_tokens: Sequence[int]) -> list[int]:
        """The observation tokens for a turn that ended with ``<|/tool_call|>``: the call is the text after the
        turn's last ``<|tool_call|>`` (the whole turn if it has none, which the tool then rejects)."""
        body = list(turn_tokens[:-1]) if turn_tokens and turn_tokens[-1] == self.call_end_id else list(turn_tokens)
        if self.call_id in body:
            body = body[len(body) - body[::-1].index(self.call_id):]
        text = self.tokenizer.decode(body, skip_special_tokens=False)
        try:
            result = self.tool(text)
        except Exception as e:  # noqa: BLE001 — a user tool that raises still answers
            result = f"error: {type(e).__name__}"
        content = self.tokenizer(str(result), add_special_tokens=False)["input_ids"][: self.max_tool_response_length]
        return [self.response_id, *content, self.response_end_id]

    # ------------------------------------------------------------------ one assistant turn for many rows
    def _generate_turn(self, model, contexts: list[list[int]], max_new_tokens: int, sampling: SamplingParams
                       ) -> tuple[list[list[int]], list[list[float]]]:
        """New tokens of each context up to and including its first stop token (EOS or ``<|/tool_call|>``), and
        their temperature-scaled log-probs from the raw logits (the hf engine's ``generate_tokens``)."""
        tokens, log_probs, mask = generate_tokens(model, self.tokenizer, contexts, max_new_tokens, sampling,
                                                  self.stop_ids, self.chunk_size)
        lengths = mask.sum(-1).long().tolist()
        return ([tokens[r, :n].tolist() for r, n in enumerate(lengths)],
                [log_probs[r, :n].tolist() for r, n in enumerate(lengths)])

    # ------------------------------------------------------------------ the loop
    @torch.no_grad()
    def generate(self, prompt_ids: Sequence[Sequence[int]], n: int, sampling: SamplingParams,
                 max_response_length: int) -> RolloutOutput:
        pad = self.tokenizer.pad_token_id
        repeated = [list(p) for p in prompt_ids for _ in range(n)]
        N = len(repeated)
        prompts, prompt_mask = left_pad(repeated, pad)
        resp: list[list[int]] = [[] for _ in range(N)]
        mask: list[list[float]] = [[] for _ in range(N)]
        logp: list[list[float]] = [[] for _ in range(N)]
        calls, turns, done = [0] * N, [0] * N, [max_response_length <= 0] * N
        with self.models.actor() as model:
            was_training = model.training
            model.eval()
            try:
                while not all(done):
                    active = [i for i in range(N) if not done[i]]
                    budget = {i: max_response_length - len(resp[i]) for i in active}
                    new, new_lp = self._generate_turn(model, [repeated[i] + resp[i] for i in active],
                                                      max(budget.values()), sampling)
                    for i, toks, lps in zip(active, new, new_lp):
                        toks, lps = toks[: budget[i]], lps[: budget[i]]
                        resp[i] += toks
                        mask[i] += [1.0] * len(toks)
                        logp[i] += lps
                        turns[i] += 1
                        room = max_response_length - len(resp[i])
                        if toks and toks[-1] == self.call_end_id and turns[i] < self.max_turns and room > 0:
                            obs = self.observation(toks)[:room]
                            calls[i] += 1
                            resp[i] += obs
                            mask[i] += [0.0] * len(obs)
                            logp[i] += [0.0] * len(obs)
                            done[i] = len(resp[i]) >= max_response_length
                        else:  # EOS, the turn limit, or the length limit
                            done[i] = True
            finally:
                model.train(was_training)
        width = max(1, max(map(len, resp)))
        responses = torch.full((N, width), pad, dtype=torch.long)
        response_mask = torch.zeros(N, width)
        attention = torch.zeros(N, width)
        rollout_log_probs = torch.zeros(N, width)
        for i in range(N):
            L = len(resp[i])
            if L:
                responses[i, :L] = torch.as_tensor(resp[i])
                response_mask[i, :L] = torch.as_tensor(mask[i])
                attention[i, :L] = 1.0
                rollout_log_probs[i, :L] = torch.as_tensor(logp[i])
        rollout_log_probs = rollout_log_probs * response_mask
        out = RolloutOutput(prompts, prompt_mask, responses, response_mask, rollout_log_probs, attention)
        self.last_num_tool_calls = out.num_tool_calls = torch.as_tensor(calls)
        self.last_num_turns = out.num_turns = torch.as_tensor(turns)
        return out


# ---------------------------------------------------------------------- standalone use (SFT eval, bench)
class StandaloneModels:
    """The slice of ``PolicyModels`` the rollout engines use, for a plain (tokenizer, model) pair."""

    def __init__(self, tokenizer: Any, model: torch.nn.Module):
        self.tokenizer, self.model = tokenizer, model
        self.device = next(model.parameters()).device

    @contextlib.contextmanager
    def actor(self) -> Iterator[torch.nn.Module]:
        yield self.model


def evaluate_tool_agent(model: Any, tokenizer: Any, dataset: Sequence[dict[str, Any]], max_assistant_turns: int = 2,
                        max_response_length: int = 32, do_sample: bool = False, temperature: float = 1.0,
                        max_tool_response_length: int = 32, reward_fn: Any = None, seed: int = 0) -> dict[str, Any]:
    """Accuracy (reward 1.0), tool-use rate (share of trajectories with ≥ 1 executed call), accuracy with and
    without the tool, mean calls, mean response length (attended tokens) on ``dataset`` (RLDataset rows)."""
    from types import SimpleNamespace

    from ppolab import rewards

    reward_fn = reward_fn or rewards.compute_score
    items = list(dataset)
    engine = ToolAgentRollout(StandaloneModels(tokenizer, model),
                              SimpleNamespace(max_assistant_turns=max_assistant_turns,
                                              max_tool_response_length=max_tool_response_length))
    rng = torch.random.fork_rng() if do_sample else contextlib.nullcontext()
    with rng:
        if do_sample:
            torch.manual_seed(seed)
        out = engine.generate([it["input_ids"] for it in items], 1, SamplingParams(temperature, 1.0, -1, do_sample),
                              max_response_length)
    texts = tokenizer.batch_decode(out.responses, skip_special_tokens=True)
    scores, _ = score_responses(reward_fn, items, texts)
    correct = torch.tensor([s == 1.0 for s in scores])
    used = out.num_tool_calls > 0
    n = max(len(items), 1)
    return {
        "accuracy": float(correct.float().mean()) if items else 0.0,
        "tool_use_rate": float(used.float().mean()) if items else 0.0,
        "accuracy_with_tool": float(correct[used].float().mean()) if used.any() else float("nan"),
        "accuracy_without_tool": float(correct[~used].float().mean()) if (~used).any() else float("nan"),
        "mean_tool_calls": float(out.num_tool_calls.float().sum() / n),
        "mean_response_length": float(out.response_attention_mask.sum() / n),
        "n": len(items),
        "output": out,
        "texts": texts,
    }
