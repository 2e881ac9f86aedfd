"""The engine: Sketch&Walk inside Hugging Face models, in three folders, one job each.

- `method/`: the method itself, pure functions of tensors and one config: the Hadamard sketch,
  the block-mass estimators, the walk, block selection, the per-layer pipeline and its decode
  half, and the registry of methods compared against it.
- `hf/`: the transformers adapter: `attn_implementation="sketch_walk"`, the per-sequence session
  that carries the walk from layer to layer, the KV cache and dense attention beside it.
- `run/`: the harness: load a model, run one prompt dense and sparse, record what each layer
  decided, compare the two and time them.

`clock.py` is the one timer all three share. Kernels live in `sketchwalk.kernels` and never
import the engine.
"""
