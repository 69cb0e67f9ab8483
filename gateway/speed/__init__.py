"""gateway.speed: what makes a model's steps faster, attached at load (attach.py).

The core engine (gateway.engine) runs every step with the model's own forward and never
imports this package; a LoadedModel may carry a `FastForward` (batch/forward.py) that
takes some of its steps. What is here:

- lean.py: the lean decoder, the model's own layers called with less overhead, checked
  bitwise against the model's forward at load;
- cpu_linear.py, packed_linear.py, native.py (+ linear_rows.cpp): the weight-major form
  of fp32 CPU linear layers, measured at load and kept where it pays;
- compiled.py, kinds.py, steps.py, store.py, warmup.py: the batch steps compiled with
  torch.compile, kept on disk between starts and warmed up at start;
- graphs.py: CUDA graphs of the compiled steps (experimental: not yet run on a GPU);
- fast.py: the FastForward that joins them.

Each earns its place by measurement: docs/decisions/.
"""

from gateway.speed.attach import accelerate, load_fast, wrap_fast
from gateway.speed.cpu_linear import keep_verdicts

__all__ = ["accelerate", "keep_verdicts", "load_fast", "wrap_fast"]
