"""Which modules moved between two checkpoints of a verl job, by how much (lab 18's per-tensor view, on the
learner's real model; chapter §1's question asked of a whole training interval).

Per tensor: ‖W‖ at the earlier checkpoint, ‖ΔW‖ = ‖W_b − W_a‖ and their ratio. A LoRA module's weights are its two
factors, so its tensors' ‖ΔA‖ and ‖ΔB‖ say little about the layer's change; what the layer computes with moved by
ΔW_eff = (α / r)·(B_b·A_b − B_a·A_a) (peft's ``scaling``), given per module beside them.
"""
from __future__ import annotations

import re
from typing import Any

import torch

from ppolab.errors import FileFormatError
from ppolab.numbers.update_effect import layer_of
from ppolab.verl_checkpoints import read_weights

#: A LoRA factor's name: the module's path, which factor, peft's adapter name if any.
LORA = re.compile(r"^(?P<module>.+)\.lora_(?P<factor>[AB])(?:\.(?P<adapter>\w+))?\.weight$")


def checkpoint_moves(a: Any, b: Any) -> dict[str, Any]:
    """The moves from checkpoint ``a`` to checkpoint ``b`` (any path :func:`ppolab.verl_checkpoints.weight_files`
    takes): ``tensors`` (name, layer, shape, before_norm, delta_norm, rel — largest ``delta_norm`` first),
    ``lora`` (module, layer, delta_norm of ΔW_eff, rel to ‖W‖ where the base weight is in the checkpoint, else
    None), ``layers`` ({layer: ‖ΔW‖ over its tensors}), ``only_in`` (tensor names one side lacks) and ``scaling``
    (α / r, None without LoRA settings). Tensors of another shape on the two sides are one line naming them."""
    wa, lora_a = read_weights(a)
    wb, lora_b = read_weights(b)
    if lora_a and lora_b and lora_a != lora_b:
        raise FileFormatError(f"{a} and {b} were trained with other LoRA settings ({lora_a} against {lora_b}): "
                              "not two checkpoints of one job")
    rows, layers = [], {}
    for name in sorted(wa.keys() & wb.keys()):
        x, y = wa[name], wb[name]
        if x.shape != y.shape:
            raise FileFormatError(f"{name} is {tuple(x.shape)} in {a} and {tuple(y.shape)} in {b}: not two "
                                  "checkpoints of one model")
        d = float((y - x).norm())
        n = float(x.norm())
        rows.append({"name": name, "layer": layer_of(name), "shape": tuple(x.shape), "before_norm": n,
                     "delta_norm": d, "rel": d / n if n > 0 else None})
        layers[layer_of(name)] = (layers.get(layer_of(name), 0.0) ** 2 + d * d) ** 0.5
    lora = lora_a or lora_b
    scaling = lora["lora_alpha"] / lora["r"] if lora else None
    modules = _lora_moves(wa, wb, 1.0 if scaling is None else scaling)
    rows.sort(key=lambda r: -r["delta_norm"])
    return {"tensors": rows, "lora": modules, "layers": layers, "scaling": scaling,
            "only_in": sorted(wa.keys() ^ wb.keys())}


def _lora_moves(wa: dict[str, torch.Tensor], wb: dict[str, torch.Tensor], scaling: float) -> list[dict[str, Any]]:
    factors: dict[str, dict[str, str]] = {}
    for name in wa.keys() & wb.keys():
        m = LORA.match(name)
        if m:
            factors.setdefault(m["module"], {})[m["factor"]] = name
    out = []
    for module, f in sorted(factors.items()):
        if set(f) != {"A", "B"}:
            continue
        d = scaling * (wb[f["B"]] @ wb[f["A"]] - wa[f["B"]] @ wa[f["A"]])
        base = next((wa[k] for k in (f"{module}.base_layer.weight", f"{module}.weight") if k in wa), None)
        dn = float(d.norm())
        out.append({"module": module, "layer": layer_of(module), "delta_norm": dn,
                    "rel": dn / float(base.norm()) if base is not None and float(base.norm()) > 0 else None})
    return sorted(out, key=lambda r: -r["delta_norm"])
