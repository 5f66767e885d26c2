"""The chapter's worked examples, computed by ppolab.algos: ``python -m ppolab.chapter``.

Each line prints the section, the inputs and what the *library* returns for them, so a reader can check
ppolab against the numbers in the chapter (§3.1, §4.2–4.4, §8.1, §10.6, §11.4).
"""
from __future__ import annotations

import torch

from ppolab.algos import agg_loss, compute_value_loss, ppo_clip_terms
from ppolab.batching import plan_batches


#: The chapter's sections, as its table of contents numbers them (§1–§17 and their subsections): the only §
#: pointers a learner may read (``tests/test_chapter_pointers.py``). §16's nine mistakes are numbered inside one
#: section, so they are cited as "§16, mistake N", never as §16.N.
SECTIONS = ("1", "2", "2.1", "2.2", "3", "3.1", "4", "4.1", "4.2", "4.3", "4.4", "5", "5.1", "5.2", "6", "7", "7.1",
            "7.2", "7.3", "7.4", "7.5", "8", "8.1", "9", "10", "10.1", "10.2", "10.3", "10.4", "10.5", "10.6", "11",
            "11.1", "11.2", "11.3", "11.4", "11.5", "11.6", "12", "12.1", "12.2", "12.3", "13", "14", "14.1", "14.2",
            "15", "16", "17")


def _t(*xs: float) -> torch.Tensor:
    return torch.tensor([list(xs)], dtype=torch.float64)


def worked_examples() -> list[tuple[str, str, float]]:
    """(section, description, value) rows computed by the same functions the trainer uses."""
    rows: list[tuple[str, str, float]] = []
    up = ppo_clip_terms(_t(-1.2), _t(-1.0), _t(1.0), 0.2, 0.2)
    rows.append(("§3.1", "ratio = exp(log_prob − old_log_prob), old −1.2, new −1.0", up["ratio"].item()))
    rows.append(("§4.2", "A = +1, ε = 0.2: loss = max(−A·r, −A·clip(r))", up["pg_losses"].item()))
    down = ppo_clip_terms(_t(-1.2), _t(-1.0), _t(-1.0), 0.2, 0.2)
    rows.append(("§4.3", "A = −1, same ratio: loss (not clipped)", down["pg_losses"].item()))
    dual = ppo_clip_terms(_t(0.0), _t(torch.tensor(5.0).log().item()), _t(-1.0), 0.2, 0.2, 3.0)
    rows.append(("§4.4", "A = −1, r = 5, clip_ratio_c = 3: dual-clipped loss", dual["pg_losses"].item()))
    vf, _ = compute_value_loss(_t(0.9), _t(1.0), _t(0.4), _t(1.0), cliprange_value=0.2)
    rows.append(("§8.1", "value loss, V_old 0.4, V_new 0.9, G 1.0, ε_v 0.2", vf.item()))
    mask = torch.zeros(2, 6, dtype=torch.float64)
    mask[0, :2], mask[1, :] = 1, 1
    for mode in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        losses = torch.ones(2, 6, dtype=torch.float64, requires_grad=True)
        agg_loss(losses, mask, mode).backward()
        share = (losses.grad[0] * mask[0]).sum() / (losses.grad * mask).sum()
        rows.append(("§10.6", f"{mode}: share of the 2-token trajectory (vs 6 tokens)", share.item()))
    plan = plan_batches(128, 8, 32, 8, 2, 2)
    rows.append(("§11.4", "optimizer steps per training step (128 prompts × 8, mini 32, dp 8, micro 2, 2 epochs)",
                 float(plan.optimizer_steps)))
    return rows


def main() -> None:
    for section, text, value in worked_examples():
        print(f"{section:6} {value:10.4f}  {text}")
    print()
    print(plan_batches(128, 8, 32, 8, 2, 2))


if __name__ == "__main__":
    main()
