"""Shared test set-up.

labml-nn 0.5.1 (the reference we compare against) calls `labml.tracker.debug`, which labml 0.5.3 lacks;
we give it a no-op so the reference modules run unchanged.
"""
import os

os.environ.setdefault('LABML_DISABLE_GIT', '1')


def _patch_labml_tracker():
    try:
        from labml import tracker
    except ImportError:  # labml is a hard dependency; the import error will surface in the tests that need it
        return
    if not hasattr(tracker, 'debug'):
        tracker.debug = lambda *args, **kwargs: None


_patch_labml_tracker()
