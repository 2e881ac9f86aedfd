"""The transformers adapter: Sketch&Walk as `attn_implementation="sketch_walk"`.

Owns the registration hook, the per-sequence session bound in a context variable (the walk's
state between layers, the step's shared plan, the kernel backend), the in-place KV cache and the
dense attention used for dense layers and baselines. It calls `engine.method` for every decision.
"""
