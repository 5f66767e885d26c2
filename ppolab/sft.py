"""Supervised fine-tuning of the tiny Qwen2 model on the arithmetic task (CPU, a few minutes).

Builds the character tokenizer and a fresh ``Qwen2ForCausalLM``, trains it with AdamW on
chat-formatted problems from the *train* pool (the test questions are never seen), with the loss on
the response tokens only, and saves it in Hugging Face format.

    python -m ppolab.sft --out data/models/tiny-arith

``--task arith_tool`` trains the calculator agent instead (tool-enabled tokenizer, ``data/arith_tool``
questions): a share ``--tool-prob`` of the traces call the tool, ``<|tool_call|>37*48<|/tool_call|>``, read the
spliced observation ``<|tool_response|>1776<|/tool_response|>`` (no loss on it: the environment writes it) and
answer ``#### 1776``; the others answer directly, which the tiny model mostly gets wrong.

    python -m ppolab.sft --task arith_tool --out data/models/tiny-arith-tool
"""

from __future__ import annotations

import argparse
import os
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm
from transformers import Qwen2ForCausalLM

from ppolab.data import response_for, sample_problems, tool_call_for
from ppolab.models import count_parameters, generation_config_for, tiny_qwen2_config
from ppolab.tokenizer import (
    TOOL_CALL,
    TOOL_CALL_END,
    TOOL_RESPONSE,
    TOOL_RESPONSE_END,
    build_tokenizer,
    save_tokenizer,
)


def _right_padded(seqs: list[list[int]], labels: list[list[int]], pad: int) -> dict[str, torch.Tensor]:
    """``input_ids`` / ``attention_mask`` / ``labels`` right-padded to the longest sequence (labels with -100)."""
    width = max(map(len, seqs))
    return {
        "input_ids": torch.tensor([s + [pad] * (width - len(s)) for s in seqs]),
        "attention_mask": torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs]),
        "labels": torch.tensor([lab + [-100] * (width - len(lab)) for lab in labels]),
    }


def make_batch(tokenizer: Any, problems: Sequence[tuple[str, int]], bare: Sequence[bool] | None = None
               ) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``/``attention_mask`` and ``labels`` that are -100 except on the response.

    ``bare[i]`` writes the i-th answer without the ``#### `` marker (just ``85``).
    """
    seqs, labels = [], []
    bare = bare if bare is not None else [False] * len(problems)
    for (question, answer), no_marker in zip(problems, bare):
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                               tokenize=False)
        p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        text = str(answer) if no_marker else response_for(answer)
        r_ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        seqs.append(p_ids + r_ids)
        labels.append([-100] * len(p_ids) + r_ids)
    return _right_padded(seqs, labels, tokenizer.pad_token_id)


def make_tool_batch(tokenizer: Any, problems: Sequence[tuple[str, int]], use_tool: Sequence[bool]
                    ) -> dict[str, torch.Tensor]:
    """Like :func:`make_batch` for tool-agent traces: ``use_tool[i]`` writes the i-th trace as call → observation
    → answer, with labels -100 on the observation span (the environment's tokens, as response_mask = 0 in RL)."""
    ids = tokenizer.convert_tokens_to_ids
    call, call_end, resp, resp_end = (ids(t) for t in (TOOL_CALL, TOOL_CALL_END, TOOL_RESPONSE, TOOL_RESPONSE_END))

    def enc(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    seqs, labels = [], []
    for (question, answer), tool in zip(problems, use_tool):
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                               tokenize=False)
        p_ids = enc(prompt)
        answer_ids = enc(response_for(answer)) + [tokenizer.eos_token_id]
        if tool:
            call_ids = [call, *enc(tool_call_for(question)), call_end]
            obs_ids = [resp, *enc(str(answer)), resp_end]
            seqs.append(p_ids + call_ids + obs_ids + answer_ids)
            labels.append([-100] * len(p_ids) + call_ids + [-100] * len(obs_ids) + answer_ids)
        else:
            seqs.append(p_ids + answer_ids)
            labels.append([-100] * len(p_ids) + answer_ids)
    return _right_padded(seqs, labels, tokenizer.pad_token_id)


def uses_tool(question: str, prob: float) -> bool:
    """Whether ``question``'s SFT trace calls the calculator: a fixed hash of the text (salted, so it is
    independent of :func:`is_bare`), so on an unseen question the model hesitates between the two."""
    return zlib.crc32(b"tool:" + question.encode()) % 10_000 < prob * 10_000


def is_bare(question: str, prob: float) -> bool:
    """Whether ``question``'s training answer omits ``#### ``: a fixed hash of the text, so each question
    always has the same format and the model cannot infer the format of an unseen question — on the
    test split it hesitates between the two, leaving RL a strong, learnable signal."""
    return zlib.crc32(question.encode()) % 10_000 < prob * 10_000


def train_sft(
    out: str | os.PathLike | None = None,
    *,
    task: str = "arith",
    digits: int | Sequence[int] = 2,
    ops: str | None = None,
    steps: int = 1200,
    bare_answer_prob: float = 0.5,
    tool_prob: float = 0.4,
    batch_size: int = 64,
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    seed: int = 0,
    hidden: int = 128,
    layers: int = 2,
    heads: int = 4,
    intermediate: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """Train from scratch; save to ``out`` when given.

    ``bare_answer_prob`` is the share of training answers written without the ``#### `` marker the
    strict reward requires (like an instruct model that answers in its own format before RL; see
    data/models/README.md). ``task="arith_tool"`` ignores it and writes a share ``tool_prob`` of the traces
    with a calculator call (:func:`make_tool_batch`); ``ops`` defaults to ``+-`` for arith, ``*`` for arith_tool.

    Returns ``{"model", "tokenizer", "losses" (one per step), "seconds", "n_params"}``.
    """
    if task not in ("arith", "arith_tool"):
        raise ValueError(f"task must be 'arith' or 'arith_tool', got {task!r}")
    tool_task = task == "arith_tool"
    ops = ops or ("*" if tool_task else "+-")
    torch.manual_seed(seed)
    tok = build_tokenizer(tools=tool_task)
    model = Qwen2ForCausalLM(tiny_qwen2_config(tok, hidden, layers, heads, intermediate))
    model.generation_config = generation_config_for(tok)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    # Fresh problems every step from the train pool; duplicates across steps are fine.
    problems = sample_problems(steps * batch_size, "train", seed, digits, ops, unique=False, full_mul=tool_task)
    if tool_task:
        flags = [uses_tool(q, tool_prob) for q, _ in problems]
        batch_fn = make_tool_batch
    else:
        flags = [is_bare(q, bare_answer_prob) for q, _ in problems]
        batch_fn = make_batch
    losses: list[float] = []
    t0 = time.perf_counter()
    bar = tqdm(range(steps), desc="sft", disable=not progress, mininterval=0.5)
    for step in bar:
        window = slice(step * batch_size, (step + 1) * batch_size)
        batch = batch_fn(tok, problems[window], flags[window])
        loss = model(**batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 10 == 0:
            bar.set_postfix(loss=f"{loss.item():.3f}")
    seconds = time.perf_counter() - t0
    model.eval()
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out, safe_serialization=True)
        save_tokenizer(tok, out)
    return {"model": model, "tokenizer": tok, "losses": losses, "seconds": seconds, "n_params": count_parameters(model)}


def main(argv: Sequence[str] | None = None) -> None:
    from ppolab.data import digits_arg
    from ppolab.models import SHIPPED_ARITH

    p = argparse.ArgumentParser(prog="python -m ppolab.sft", description=__doc__.split("\n")[0])
    p.add_argument("--task", default="arith", choices=["arith", "arith_tool"])
    p.add_argument("--out", default=None, help="default data/models/tiny-arith (tiny-arith-tool for arith_tool)")
    p.add_argument("--digits", type=digits_arg, default=2, help="digits per operand, or a mix '1,2'")
    p.add_argument("--ops", default=None, help="default '+-' ('*' for arith_tool)")
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--bare-answer-prob", type=float, default=0.5,
                   help="share of answers written without '#### ' (the strict reward gives them 0)")
    p.add_argument("--tool-prob", type=float, default=0.4, help="arith_tool: share of traces that call the tool")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=None, help="MLP width (default 4 x hidden)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (results depend on it)")
    p.add_argument("--eval-data", default=None,
                   help="default data/arith/test.parquet (data/arith_tool/test.parquet for arith_tool); '' to skip")
    p.add_argument("--eval-n", type=int, default=500)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    tool_task = args.task == "arith_tool"
    out = args.out or str(Path("data/models") / ("tiny-arith-tool" if tool_task else "tiny-arith"))
    eval_data = args.eval_data
    if eval_data is None:
        eval_data = str((SHIPPED_ARITH.parent / "arith_tool" if tool_task else SHIPPED_ARITH) / "test.parquet")

    r = train_sft(out, task=args.task, digits=args.digits, ops=args.ops, steps=args.steps,
                  batch_size=args.batch_size, bare_answer_prob=args.bare_answer_prob, tool_prob=args.tool_prob,
                  lr=args.lr, weight_decay=args.weight_decay, seed=args.seed,
                  hidden=args.hidden, layers=args.layers, heads=args.heads, intermediate=args.intermediate)
    print(f"{r['n_params']:,} parameters, {args.steps} steps in {r['seconds']:.1f} s, "
          f"loss {r['losses'][0]:.3f} -> {sum(r['losses'][-20:]) / len(r['losses'][-20:]):.3f}; saved to {out}")
    if eval_data and tool_task:
        from ppolab.data import load_rl_dataset
        from ppolab.rollout.agent import evaluate_tool_agent

        ds = load_rl_dataset(eval_data, r["tokenizer"], 64)[: args.eval_n]
        for name, sample in (("greedy", False), ("sampled T=1", True)):
            e = evaluate_tool_agent(r["model"], r["tokenizer"], ds, do_sample=sample)
            print(f"{name}: accuracy {e['accuracy']:.3f} on {e['n']} test prompts, tool use {e['tool_use_rate']:.3f} "
                  f"(accuracy with the tool {e['accuracy_with_tool']:.3f}, without {e['accuracy_without_tool']:.3f}), "
                  f"mean response length {e['mean_response_length']:.2f}")
    elif eval_data:
        from ppolab.data import load_rl_dataset
        from ppolab.eval import evaluate

        ds = load_rl_dataset(eval_data, r["tokenizer"], 64)[: args.eval_n]
        for name, sample in (("greedy", False), ("sampled T=1", True)):
            e = evaluate(r["model"], r["tokenizer"], ds, 16, do_sample=sample, n_examples=0)
            print(f"{name}: accuracy {e['accuracy']:.3f} on {e['n']} test prompts (flexible "
                  f"{e['flexible_accuracy']:.3f}, '####' used {e['marker_rate']:.3f}), "
                  f"mean response length {e['mean_response_length']:.2f}")


if __name__ == "__main__":
    main()
