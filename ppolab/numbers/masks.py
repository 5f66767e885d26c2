"""Chapter §9's numbers: which token is what (prompt, response, padding, tool observation, rejected), the one-token
shift, and the run's tokenizer."""
from __future__ import annotations


import torch

from ppolab.numbers.steps import real_rows


#: Category codes of the token map (z of the heatmap).
CATEGORIES = {0: "padding", 1: "prompt", 2: "response", 3: "synthetic padding row", 4: "tool observation",
              5: "rejected token"}


def run_tokenizer(run):
    """The tokenizer ``run`` was trained with: its ``tokenizer/`` folder (:meth:`ppolab.run.reader.Run.tokenizer`), else
    (a run recorded before runs carried it) the tokenizer files of its base model where :meth:`ppolab.run.reader.Run.
    model_path` finds that model by its recorded fingerprint. A run with neither is a
    :class:`~ppolab.numbers.needs.RunLacks` — never decoded with another model's vocabulary."""
    from ppolab.errors import MissingFileError
    from ppolab.models import load_tokenizer_files
    from ppolab.numbers.needs import RunLacks

    try:
        return run.tokenizer()
    except MissingFileError as e:
        try:
            return load_tokenizer_files(run.model_path())
        except MissingFileError:
            raise RunLacks(f"the tokenizer it was trained with ({e})", run) from None


def token_categories(record) -> torch.Tensor:
    """(N, P + R) integer codes of :data:`CATEGORIES` from prompt_mask, response_mask, loss_mask and is_pad; with a
    ``response_attention_mask`` (multi-turn tool rollouts), attended response tokens with response_mask 0 are
    tool observations; tokens with ``loss_mask`` 1 but response_mask 0 were sampled by the policy and then dropped
    by rollout rejection sampling (``algorithm.rollout_correction.rollout_rs``), which rewrites only response_mask."""
    t = record.tensors
    response = 2 * t["response_mask"].long()
    if "loss_mask" in t:
        rejected = t["loss_mask"].bool() & ~t["response_mask"].bool()
        response = torch.where(rejected, torch.full_like(response, 5), response)
    if "response_attention_mask" in t:
        observation = t["response_attention_mask"].bool() & ~t["response_mask"].bool() & (response != 5)
        response = torch.where(observation, torch.full_like(response, 4), response)
    cats = torch.cat([t["prompt_mask"].long(), response], dim=1)
    pad_rows = ~real_rows(record)
    cats[pad_rows] = 3
    return cats


def shift_table(record, tokenizer, row: int) -> dict[str, list]:
    """The one-token shift of one row: for each response position j, the input position whose logits predict
    it (P − 1 + j), the token at that input position, the predicted response token, and its masks
    (``response_mask``, ``loss_mask`` and, when recorded, ``response_attention_mask``)."""
    t = record.tensors
    P = t["prompts"].shape[1]
    seq = torch.cat([t["prompts"][row], t["responses"][row]])
    R = t["responses"].shape[1]
    out = {"response position j": list(range(R)), "logit position": [P - 1 + j for j in range(R)],
           "input token there": [tokenizer.decode([int(seq[P - 1 + j])]) for j in range(R)],
           "predicts response token": [tokenizer.decode([int(t["responses"][row, j])]) for j in range(R)],
           "response_mask": [int(x) for x in t["response_mask"][row].tolist()],
           "loss_mask": [int(x) for x in t["loss_mask"][row].tolist()] if "loss_mask" in t else [None] * R}
    if "response_attention_mask" in t:  # what the model reads: 1 on tool observations and on rejected tokens too
        out["response_attention_mask"] = [int(x) for x in t["response_attention_mask"][row].tolist()]
    return out
