"""The Sketch&Walk method: which key blocks each query block attends to, and why.

Owns the knobs (`config.SketchWalkConfig`), the Hadamard sketch, the block-mass estimators, the
walk across layers, the selection to a density budget and the per-layer pipeline that turns a
layer's queries and keys into the `BlockLists` the kernels execute, in prefill and decode. No
transformers here: inputs are tensors, outputs are tensors and plain dataclasses.
"""
