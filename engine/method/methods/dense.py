"""The dense reference: every layer runs full attention (no scores, nothing selected)."""

from __future__ import annotations

from sketchwalk.engine.method.methods.base import Method

METHOD = Method(name="dense", help="dense attention (the reference)", score=None)
