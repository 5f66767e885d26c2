"""Train a preset while watching what the workers really execute; every rank writes its trace.

    python tests/dist/plan_trace.py OUT_DIR PRESET [overrides…]                       # one rank
    torchrun --standalone --nproc_per_node 2 tests/dist/plan_trace.py OUT_DIR PRESET [overrides…]

The run goes to OUT_DIR/run; rank r writes OUT_DIR/trace_r.json: per worker update, in order, the role and, per
optimizer step, the row ids of each micro-batch as the loss saw them (``mb["row_id"]``) and the global counts the
loss was given. Used by tests/test_update_plan.py: the recorded plan must equal this trace.
"""
import json
import os
import sys
from pathlib import Path

import torch

from ppolab import train
from ppolab.worker import ActorWorker, CriticWorker, Worker

UPDATES: list[dict] = []


def watch() -> None:
    update, step = Worker.update, Worker.optimizer_step

    def traced_update(self, batch):
        UPDATES.append({"role": self.prefix, "steps": [{"micro_batches": [], "infos": []}]})
        out = update(self, batch)
        UPDATES[-1]["steps"].pop()  # the step opened after the last optimizer step
        return out

    def traced(loss):  # each role defines its own loss
        def traced_loss(self, mb, info):
            opt = UPDATES[-1]["steps"][-1]
            opt["micro_batches"].append([int(i) for i in mb["row_id"]])
            opt["infos"].append([info.dp_size, info.batch_num_tokens, info.global_batch_size, info.loss_scale_factor])
            return loss(self, mb, info)
        return traced_loss

    def traced_step(self, params):
        UPDATES[-1]["steps"].append({"micro_batches": [], "infos": []})
        return step(self, params)

    Worker.update, Worker.optimizer_step = traced_update, traced_step
    ActorWorker.loss, CriticWorker.loss = traced(ActorWorker.loss), traced(CriticWorker.loss)


def main(out: Path, preset: str, overrides: list[str]) -> None:
    torch.set_num_threads(1)
    watch()
    train(preset, [*overrides, f"trainer.run_dir={out / 'run'}"], progress=False)
    rank = int(os.environ.get("RANK", "0"))
    (out / f"trace_{rank}.json").write_text(json.dumps(UPDATES))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3:])
