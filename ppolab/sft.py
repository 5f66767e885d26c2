"""Supervised fine-tuning of the tiny Qwen2 model on the arithmetic task (CPU, a few minutes).

Builds the character tokenizer and a fresh ``Qwen2ForCausalLM``, trains it with AdamW on
chat-formatted problems from the *train* pool (the test questions are never seen), with the loss on
the response tokens only, and saves it in Hugging Face format.

    python -m ppolab.sft --out data/models/tiny-arith
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

from ppolab.data import response_for, sample_problems
from ppolab.models import count_parameters, generation_config_for, tiny_qwen2_config
from ppolab.tokenizer import build_tokenizer, save_tokenizer


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
    width = max(map(len, seqs))
    pad = tokenizer.pad_token_id
    return {
        "input_ids": torch.tensor([s + [pad] * (width - len(s)) for s in seqs]),
        "attention_mask": torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs]),
        "labels": torch.tensor([lab + [-100] * (width - len(lab)) for lab in labels]),
    }


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
    ops: str = "+-",
    steps: int = 1200,
    bare_answer_prob: float = 0.5,
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
    data/models/README.md).

    Returns ``{"model", "tokenizer", "losses" (one per step), "seconds", "n_params"}``.
    """
    if task != "arith":
        raise ValueError(f"only task='arith' is built in, got {task!r}")
    torch.manual_seed(seed)
    tok = build_tokenizer()
    model = Qwen2ForCausalLM(tiny_qwen2_config(tok, hidden, layers, heads, intermediate))
    model.generation_config = generation_config_for(tok)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    # Fresh problems every step from the train pool; duplicates across steps are fine.
    problems = sample_problems(steps * batch_size, "train", seed, digits, ops, unique=False)
    bare = [is_bare(q, bare_answer_prob) for q, _ in problems]
    losses: list[float] = []
    t0 = time.perf_counter()
    bar = tqdm(range(steps), desc="sft", disable=not progress, mininterval=0.5)
    for step in bar:
        window = slice(step * batch_size, (step + 1) * batch_size)
        batch = make_batch(tok, problems[window], bare[window])
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
    from ppolab.data import _digits
    from ppolab.models import SHIPPED_ARITH

    p = argparse.ArgumentParser(prog="python -m ppolab.sft", description=__doc__.split("\n")[0])
    p.add_argument("--task", default="arith", choices=["arith"])
    p.add_argument("--out", default="data/models/tiny-arith")
    p.add_argument("--digits", type=_digits, default=2, help="digits per operand, or a mix '1,2'")
    p.add_argument("--ops", default="+-")
    p.add_argument("--steps", type=int, default=1200)
    p.add_argument("--bare-answer-prob", type=float, default=0.5,
                   help="share of answers written without '#### ' (the strict reward gives them 0)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=None, help="MLP width (default 4 x hidden)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (results depend on it)")
    p.add_argument("--eval-data", default=str(SHIPPED_ARITH / "test.parquet"), help="'' to skip the final eval")
    p.add_argument("--eval-n", type=int, default=500)
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    r = train_sft(args.out, task=args.task, digits=args.digits, ops=args.ops, steps=args.steps,
                  batch_size=args.batch_size, bare_answer_prob=args.bare_answer_prob, lr=args.lr, weight_decay=args.weight_decay, seed=args.seed,
                  hidden=args.hidden, layers=args.layers, heads=args.heads, intermediate=args.intermediate)
    print(f"{r['n_params']:,} parameters, {args.steps} steps in {r['seconds']:.1f} s, "
          f"loss {r['losses'][0]:.3f} -> {sum(r['losses'][-20:]) / len(r['losses'][-20:]):.3f}; saved to {args.out}")
    if args.eval_data:
        from ppolab.data import load_rl_dataset
        from ppolab.eval import evaluate

        ds = load_rl_dataset(args.eval_data, r["tokenizer"], 64)[: args.eval_n]
        for name, sample in (("greedy", False), ("sampled T=1", True)):
            e = evaluate(r["model"], r["tokenizer"], ds, 16, do_sample=sample, n_examples=0)
            print(f"{name}: accuracy {e['accuracy']:.3f} on {e['n']} test prompts (flexible "
                  f"{e['flexible_accuracy']:.3f}, '####' used {e['marker_rate']:.3f}), "
                  f"mean response length {e['mean_response_length']:.2f}")


if __name__ == "__main__":
    main()
