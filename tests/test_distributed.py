"""Data parallelism across processes on CPU (gloo): dp=2 gives the same update as dp=1 (chapter §13)."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import ppolab

from helpers import logged, stable

ROOT = Path(__file__).resolve().parent.parent


def torchrun(nproc: int, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """Run torchrun in its own session; on a timeout the whole group (launcher and ranks) is killed, so a hung rank
    does not outlive the test holding gigabytes."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"torchrun timed out after {timeout} s:\n{stdout[-4000:]}{stderr[-4000:]}")
    out = subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def updates(tmp_path_factory):
    dirs = {}
    for dp in (1, 2):
        d = tmp_path_factory.mktemp(f"dp{dp}")
        torchrun(dp, "tests/dist/one_update.py", str(d))
        dirs[dp] = d
    return dirs


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_two_ranks_give_the_same_lora_weights_as_one(updates, mode):
    one, two = (load_file(str(updates[dp] / f"{mode}.safetensors")) for dp in (1, 2))
    results = {dp: json.loads((updates[dp] / "results.json").read_text())[mode] for dp in (1, 2)}
    assert results[2]["local_rows"] * 2 == results[1]["local_rows"] == 128  # each rank really held half
    assert one.keys() == two.keys() and len(one) > 0
    for k in one:
        torch.testing.assert_close(two[k], one[k], atol=1e-5, rtol=0)
    # The global losses agree too: per-rank shares × dp_size, averaged over ranks.
    assert results[2]["metrics"]["actor/pg_loss"] == pytest.approx(results[1]["metrics"]["actor/pg_loss"], abs=1e-5)


@pytest.mark.slow  # a two-rank run (15 s)
def test_torchrun_trains_with_two_ranks_and_only_rank0_writes(tmp_path):
    run_dir = tmp_path / "run"
    torchrun(2, "-m", "ppolab.train", "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4",
             "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
             "data.val_max_samples=16", "trainer.total_training_steps=2", "trainer.test_freq=2",
             f"trainer.run_dir={run_dir}")
    run = ppolab.load_run(run_dir)
    assert run.info["world_size"] == 2 and run.info["batch_plan"]["dp_size"] == 2
    assert list(run.metrics.index) == [0, 1, 2] and "val/accuracy" in run.metrics
    rec = run.step(2)
    assert rec["responses"].shape[0] == 16  # the whole step batch, gathered from both ranks
    assert not torch.isnan(rec["old_log_probs"]).any()
    assert len(list(tmp_path.rglob("metrics.jsonl"))) == 1


@pytest.mark.slow
def test_two_rank_resume_continues_exactly(tmp_path):
    args = ["-m", "ppolab.train", "data.train_batch_size=4", "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.save_freq=1"]
    torchrun(2, *args, "trainer.total_training_steps=3", f"trainer.run_dir={tmp_path / 'full'}")
    torchrun(2, *args, "trainer.total_training_steps=2", f"trainer.run_dir={tmp_path / 'part'}")
    assert sorted(p.name for p in (tmp_path / "part" / "checkpoints" / "step_000002").glob("rng_rank*")) == [
        "rng_rank0.safetensors", "rng_rank1.safetensors"]  # each rank's own sampling state
    torchrun(2, *args, "trainer.total_training_steps=3", f"trainer.run_dir={tmp_path / 'part'}", "trainer.resume=true")

    full, resumed = ([stable(row) for row in logged(tmp_path / d)] for d in ("full", "part"))
    assert [r["step"] for r in resumed] == [1, 2, 3]
    for a, b in zip(full, resumed):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-7), k
