"""The fixture the in-process labml tests share (test_adapter.py, test_labml_internals.py).

    labml_state   labml's experiment, lab and tracker singletons saved and put back around the test, a fresh lab
                  whose run folders are under tmp_path/logs (the test runs in tmp_path), and lazylab's patches of
                  labml undone afterwards
"""
import labml.internal.experiment as labml_experiment
import labml.internal.lab as labml_lab
import labml.internal.tracker as labml_tracker
import pytest

import lazylab.labml
from lazylab.labml import adapter


@pytest.fixture
def labml_state(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    saved = (labml_experiment._internal, labml_experiment._global_params, labml_lab._internal, labml_tracker._internal)
    # fresh command-line overrides too: a test that sets them mutates the object, which restoring it would keep
    labml_experiment._global_params = None
    # a fresh lab and tracker: labml's Tracker() consumes the lab's indicator settings (it deletes their
    # 'class_name'), so a second tracker over a lab an earlier test used would fail
    adapter.configure_lab(tmp_path / 'logs', tmp_path / 'data')
    labml_tracker._internal = None
    yield
    lazylab.labml.uninstall()
    adapter.SESSION = None
    adapter.MODELS.clear()
    labml_experiment._internal, labml_experiment._global_params, labml_lab._internal, labml_tracker._internal = saved
