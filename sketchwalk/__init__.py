"""Sketch&Walk sparse attention: engine, kernels, store and app."""

__version__ = "0.1.0"
