"""One actor update on a fixed recorded batch under torchrun (1 or 2 ranks); rank 0 saves the LoRA weights.

    torchrun --standalone --nproc_per_node 2 tests/dist/one_update.py OUT_DIR

Used by tests/test_distributed.py: the same update with dp=1 and dp=2 must give the same weights (§13).
"""
import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from ppolab import distributed
from ppolab.batch import Batch
from ppolab.run.reader import Run
from ppolab.train import resolve_config
from ppolab.trainer import PPOTrainer
from ppolab.widgets.common import SHIPPED_RUNS
from ppolab.worker import ActorWorker

KEYS = ("prompts", "prompt_mask", "responses", "response_mask", "loss_mask", "rollout_log_probs", "old_log_probs",
        "ref_log_prob", "advantages", "uid")


def main(out: Path) -> None:
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    info = distributed.init_from_env("cpu")
    recorded = Run(SHIPPED_RUNS["grpo_tiny"]).step(1).tensors  # 16 prompts × 8 = 128 rows
    results = {}
    for mode in ("token-mean", "seq-mean-token-mean"):
        cfg = resolve_config("grpo_tiny", [
            "actor_rollout_ref.actor.ppo_mini_batch_size=16", "actor_rollout_ref.actor.ppo_epochs=1",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16", f"actor_rollout_ref.actor.loss_agg_mode={mode}",
        ], world_size=world)
        trainer = PPOTrainer(cfg, info)
        batch = Batch({k: recorded[k].clone() for k in KEYS} | {"is_pad": recorded["is_pad"].bool()})
        batch, _ = trainer.balance_batch(batch)  # equal-size partitions; this rank keeps its chunk
        params = trainer.models.actor_parameters()
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():  # B ≠ 0 so that A gets gradient too
            for p in params:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
        worker = ActorWorker(trainer.actor.config, trainer.models, temperature=trainer.actor.temperature,
                             rollout_n=trainer.actor.rollout_n, dist=info,
                             optimizer=torch.optim.SGD(params, lr=1.0))  # exact, unlike Adam's ~sign(g) first step
        metrics, *_ = worker.update(trainer.local(batch))
        if info.is_main:
            save_file({f"p{i}": p.detach().contiguous() for i, p in enumerate(params)},
                      str(out / f"{mode}.safetensors"))
            results[mode] = {"metrics": metrics, "local_rows": len(trainer.local_rows), "world_size": world}
    if info.is_main:
        (out / "results.json").write_text(json.dumps(results, indent=1))
    distributed.finish(info)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
