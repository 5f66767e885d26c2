"""The §7.3 full-distribution table (``ppolab.numbers.kl.moments_table``, what lab 08's exact-KL explorer shows)
works a cache-sized block of positions at a time; the blocks change nothing but the summation order."""
from __future__ import annotations

import math

import torch

from ppolab.algos import estimator_moments, exact_kl, full_log_probs
from ppolab.numbers import kl as nkl


def test_the_blockwise_table_is_the_whole_tensor_formula():
    torch.manual_seed(3)
    n, vocab = 70, 5000  # BLOCK_ELEMENTS // 5000 = 26 positions a block: three blocks, the last one short
    assert n > nkl.BLOCK_ELEMENTS // vocab > 1
    logits = 3 * torch.randn(n, vocab, dtype=torch.float64)
    mask = torch.rand(n) > 0.25
    tab = nkl.moments_table(logits, mask, 1.0, 0.7, nkl.CANONICAL)
    lp_ref, lp_theta = full_log_probs(logits[mask], 1.0), full_log_probs(logits[mask], 0.7)
    kl = exact_kl(lp_theta, lp_ref).mean().item()
    assert math.isclose(tab["kl"], kl, rel_tol=1e-12)
    assert math.isclose(tab["reverse_kl"], exact_kl(lp_ref, lp_theta).mean().item(), rel_tol=1e-12)
    assert tab["n_positions"] == int(mask.sum())
    for name in nkl.CANONICAL:
        for sampler, lp_s in (("pi_theta", lp_theta), ("pi_ref", lp_ref)):
            mean, var = estimator_moments(lp_theta, lp_ref, lp_s, name)
            row = tab["rows"][name][sampler]
            assert math.isclose(row["mean"], mean.mean().item(), rel_tol=1e-12, abs_tol=1e-15), (name, sampler)
            assert math.isclose(row["var"], var.mean().item(), rel_tol=1e-12, abs_tol=1e-15), (name, sampler)
            assert math.isclose(row["bias"], row["mean"] - kl, rel_tol=1e-12, abs_tol=1e-15)
    # §7.3: k1 is unbiased under a ∼ π_θ (k3 too, but for verl's clamp at 10, which these wide logits reach)
    assert math.isclose(tab["rows"]["k1"]["pi_theta"]["mean"], kl, rel_tol=1e-9)
