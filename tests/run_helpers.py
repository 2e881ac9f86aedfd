"""Helpers shared by the app tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

from pathlib import Path

from sketchwalk.engine.method.config import SketchWalkConfig

APP = Path(__file__).resolve().parents[1] / "app" / "streamlit_app.py"
INJECTION = "<script>alert(1)</script><img src=x onerror=alert(2)>"


def tiny_config(**changes) -> dict:
    return SketchWalkConfig(block_size=16, **changes).to_dict()


def new_app():
    from streamlit.testing.v1 import AppTest

    return AppTest.from_file(str(APP), default_timeout=120)


def spec(chart) -> dict:
    """The plotly figure JSON of an AppTest plotly_chart element."""
    import json

    return json.loads(chart.proto.spec)


def z_array(trace: dict):
    """A heatmap's z as numpy, whether plotly sent it as a list or as base64 typed data."""
    import base64

    import numpy as np

    z = trace["z"]
    if isinstance(z, dict):
        arr = np.frombuffer(base64.b64decode(z["bdata"]), dtype=np.dtype(z["dtype"]))
        shape = [int(s) for s in str(z.get("shape", arr.size)).split(",")]
        return arr.reshape(shape)
    return np.array(z, dtype=float)
