"""The run harness: one prompt through the dense model and the sparse one, compared and timed.

Owns model loading, the checked run request, the recorder that copies each layer's decisions to
plain records for the store, the quality metrics and the clean timings. It drives `engine.hf`
and never changes what a run decides.
"""
