"""The trainer's side of the dashboard: labml app URLs, the user's labml configuration, the reachability check and
the bounded wait for the last upload."""
import socket

import pytest

from lazylab import dashboard


def test_track_url():
    assert dashboard.track_url('http://127.0.0.1:5005') == 'http://127.0.0.1:5005/api/v1/default'
    assert dashboard.track_url('http://localhost:5005/') == 'http://localhost:5005/api/v1/default'
    assert dashboard.track_url('https://x.org/api/v1/TOKEN/') == 'https://x.org/api/v1/TOKEN'
    for bad in ['127.0.0.1:5005', 'ftp://h:1', 'http://h:1/?a=b']:
        with pytest.raises(ValueError, match='dashboard'):
            dashboard.track_url(bad)


def test_configured_app_url_reads_nearest_labml_yaml(tmp_path, monkeypatch):
    monkeypatch.delenv('labml_app_url', raising=False)
    (tmp_path / '.labml.yaml').write_text('app_url: http://127.0.0.1:7777/api/v1/default\n')
    sub = tmp_path / 'a' / 'b'
    sub.mkdir(parents=True)
    assert dashboard.configured_app_url(sub) == 'http://127.0.0.1:7777/api/v1/default'
    monkeypatch.setenv('labml_app_url', 'http://127.0.0.1:8888/api/v1/x')
    assert dashboard.configured_app_url(sub) == 'http://127.0.0.1:8888/api/v1/x'


def test_app_writer_returns_labml_url_only_when_reachable(capsys):
    with socket.socket() as listener:
        listener.bind(('127.0.0.1', 0))
        listener.listen()
        port = listener.getsockname()[1]
        assert dashboard.app_writer(f'http://127.0.0.1:{port}') == f'http://127.0.0.1:{port}/api/v1/default'
    assert capsys.readouterr().err == ''
    assert dashboard.app_writer(f'http://127.0.0.1:{port}') is None  # the listener is closed now
    assert capsys.readouterr().err.count('lazylab: warning') == 1


def test_wait_for_app_upload_gives_up_on_a_hung_server(capsys):
    """A finished run whose last upload never completes must not keep the process alive: the wait is bounded."""
    import threading

    import labml.internal.app as labml_client

    class HungUpload(labml_client._AppTrackThread):
        def _process(self, packets):  # a server that accepted the connection and never answers
            threading.Event().wait()

    thread = HungUpload('http://127.0.0.1:9/api/v1/default/track?', timeout_seconds=1, daemon=True)
    thread.push_data_source(labml_client.SimpleAppTrackDataSource({'time': 0.0}))
    thread.start()
    thread.stop()  # what labml does when the run finishes
    assert dashboard.wait_for_app_upload(timeout=0.5, threads=[thread]) is False
    assert 'gave up sending the last metrics' in capsys.readouterr().err
    assert dashboard.wait_for_app_upload(timeout=0.5, threads=[]) is True
