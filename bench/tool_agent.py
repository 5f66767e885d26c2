"""Tool use and accuracy of the calculator agent before and after GRPO (preset grpo_tool_tiny, CPU).

    python bench/tool_agent.py [--steps 40] [--eval-n 200] [--threads 1] [key=value ...]

Builds the trainer from the preset, evaluates the actor on the first ``--eval-n`` test prompts (greedy, and
sampled at temperature 1) with the multi-turn tool agent loop, trains ``--steps`` GRPO steps (printing the
mean training reward and tool-use rate of each step's rollouts), and evaluates again. Numbers, not asserts.
"""
from __future__ import annotations

import argparse
import time

import torch


def evaluate(trainer, data, seed: int = 0) -> dict[str, dict[str, float]]:
    from ppolab.rollout.agent import evaluate_tool_agent

    mt = trainer.config.actor_rollout_ref.rollout.multi_turn
    out = {}
    with trainer.models.actor() as model:
        for name, sample in (("greedy", False), ("sampled", True)):
            e = evaluate_tool_agent(model, trainer.tokenizer, data, mt.max_assistant_turns,
                                    trainer.config.data.max_response_length, do_sample=sample,
                                    max_tool_response_length=mt.max_tool_response_length, seed=seed)
            out[name] = {k: v for k, v in e.items() if isinstance(v, (int, float))}
    return out


def show(title: str, ev: dict[str, dict[str, float]]) -> None:
    for name, e in ev.items():
        print(f"{title:>7} {name:<8} accuracy {e['accuracy']:.3f}  tool use {e['tool_use_rate']:.3f}  "
              f"(accuracy with tool {e['accuracy_with_tool']:.3f}, without {e['accuracy_without_tool']:.3f})  "
              f"calls/trajectory {e['mean_tool_calls']:.2f}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="grpo_tool_tiny")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--eval-n", type=int, default=200)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    p.add_argument("overrides", nargs="*")
    args = p.parse_intermixed_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    from ppolab.data import load_rl_dataset
    from ppolab.train import resolve_config
    from ppolab.trainer import PPOTrainer

    cfg = resolve_config(args.preset, [f"trainer.total_training_steps={args.steps}", *args.overrides])
    t = PPOTrainer(cfg)
    data = load_rl_dataset(cfg.data.val_files, t.tokenizer, cfg.data.max_prompt_length)[: args.eval_n]
    before = evaluate(t, data)
    show("before", before)
    start = time.perf_counter()
    for step in range(args.steps):
        metrics, *_ = t.step()
        calls = t.rollout.last_num_tool_calls
        if step % 5 == 0 or step == args.steps - 1:
            print(f"step {step + 1:3d}: reward {metrics.get('critic/score/mean', float('nan')):.3f}  "
                  f"tool use {float((calls > 0).float().mean()):.3f}  "
                  f"response length {metrics.get('response_length/mean', float('nan')):.1f}  "
                  f"kl {metrics.get('actor/kl_loss', float('nan')):.4f}")
    train_s = time.perf_counter() - start
    after = evaluate(t, data)
    show("after", after)
    print(f"{args.steps} GRPO steps in {train_s:.1f} s ({train_s / max(args.steps, 1):.2f} s/step), "
          f"torch threads {torch.get_num_threads()}, {len(data)} eval prompts")


if __name__ == "__main__":
    main()
