"""fla_ref.py - loads fla's pure-PyTorch KDA reference functions without importing the
fla package (whose __init__ and gate.py import Triton).

The functions are taken verbatim from the files of a fla checkout
(fla/ops/kda/naive.py: naive_recurrent_kda; fla/ops/kda/gate.py: naive_kda_gate,
naive_kda_lowerbound_gate): each function's source is cut out of its file with `ast`
and executed in a fresh namespace. Nothing in their text is edited.

Precision. fla's references compute in float32: naive_recurrent_kda casts its inputs
with `x.to(torch.float)` and the gate functions call `tensor.float()`. Our vectors are
float64, so `load(dtype=torch.float64)` runs the same source with two substitutions that
only change the working precision:
  * the name `torch` in the functions' namespace is a proxy whose attribute `float` is
    torch.float64 (every other attribute is the real torch module);
  * while a gate function runs, `torch.Tensor.float` converts to float64 (context
    manager `float_is_double`), and callers pass output_dtype=torch.float64.
`load(dtype=torch.float32)` gives the untouched functions (real torch); make_vectors.py
compares the two on every vector case to show the substitution changes rounding only.
"""
import ast
import contextlib
import os
import subprocess
import types
import warnings

import torch
import torch.nn.functional as F

# fla's lower-bound gate calls F.sigmoid, which torch 1.13 flags as deprecated
warnings.filterwarnings("ignore", message="nn.functional.sigmoid is deprecated")

FUNCS = {
    "fla/ops/kda/naive.py": ["naive_recurrent_kda"],
    "fla/ops/kda/gate.py": ["naive_kda_gate", "naive_kda_lowerbound_gate"],
}


class _Torch64(types.ModuleType):
    """The torch module, except that `torch.float` names float64."""

    def __init__(self):
        super().__init__("torch")
        self.float = torch.float64

    def __getattr__(self, name):
        return getattr(torch, name)


@contextlib.contextmanager
def float_is_double():
    """Within the block, tensor.float() converts to float64 (fla's gate references call
    .float() to lift bf16/fp16 inputs to their working precision)."""
    keep = torch.Tensor.float
    torch.Tensor.float = lambda self, *a, **k: self.to(torch.float64)
    try:
        yield
    finally:
        torch.Tensor.float = keep


def fla_commit(fla_dir):
    p = os.path.join(fla_dir, "COMMIT")
    if os.path.exists(p):
        return open(p).read().strip()
    return subprocess.check_output(["git", "-C", fla_dir, "rev-parse", "HEAD"], text=True).strip()


def load(fla_dir, dtype=torch.float64):
    """Returns {function name: function} for FUNCS, running in `dtype` (see module doc)."""
    out = {}
    for rel, names in FUNCS.items():
        path = os.path.join(fla_dir, rel)
        src = open(path).read()
        tree = ast.parse(src, filename=path)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in names:
                seg = ast.get_source_segment(src, node)
                ns = {"torch": _Torch64() if dtype == torch.float64 else torch, "F": F}
                exec(compile(seg, path, "exec"), ns)
                out[node.name] = ns[node.name]
        missing = [n for n in names if n not in out]
        if missing:
            raise RuntimeError(f"{path} lacks {missing}")
    return out
