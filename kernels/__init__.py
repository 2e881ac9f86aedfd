"""Block-sparse attention kernels behind one entry point (kernels/backends.py) and one contract
(kernels/lists.py BlockLists); the torch reference every kernel is tested against is
kernels/reference.py.

This folder is installed as `sketchwalk.kernels`. Run from the checkout's root, Python also finds
it as the top-level `kernels`, the name of Hugging Face's hub-kernels distribution, which
transformers imports while loading a model. Imported under that name, the folder hands the name
over to the installed distribution (kernels/handover.py) instead of posing as it.
"""

from __future__ import annotations

if __name__ == "kernels":
    from .handover import hand_over

    hand_over(__file__)
else:
    from .backends import (
        BACKENDS,
        REGISTRY,
        Backend,
        BackendLimits,
        BlockSparseAttention,
        DecodeKeeper,
        backend_for,
        block_sparse_attention,
        choose_backend,
        kernel,
        limits_error,
        use_backend,
    )
    from .lists import BlockLists, dense_lists
    from .reference import block_sparse_attention_reference, selected_block_mask

    __all__ = [
        "BACKENDS",
        "REGISTRY",
        "Backend",
        "BackendLimits",
        "BlockLists",
        "BlockSparseAttention",
        "DecodeKeeper",
        "backend_for",
        "block_sparse_attention",
        "block_sparse_attention_reference",
        "choose_backend",
        "dense_lists",
        "kernel",
        "limits_error",
        "selected_block_mask",
        "use_backend",
    ]
