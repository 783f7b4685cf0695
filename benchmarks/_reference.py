"""Makes the labml_nn 0.5.1 reference importable by the benchmarks (run them as `python benchmarks/NAME.py`).

labml-nn 0.5.1's MultiHeadAttention calls `labml.tracker.debug`, which labml 0.5.3 lacks; importing this module
gives it a no-op (tests/conftest.py does the same for the tests).
"""
from labml import tracker

if not hasattr(tracker, 'debug'):
    tracker.debug = lambda *args, **kwargs: None
