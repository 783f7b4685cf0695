"""The trainer's side of the dashboard: labml app URLs, the user's labml configuration, the reachability check and
the bounded wait for the last upload."""
import contextlib

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
    with tiny_server(200, b'{"runs": [], "labml_token": "default"}') as port:  # answers as a labml app does
        assert dashboard.app_writer(f'http://127.0.0.1:{port}') == f'http://127.0.0.1:{port}/api/v1/default'
    assert capsys.readouterr().err == ''
    assert dashboard.app_writer(f'http://127.0.0.1:{port}') is None  # the server is closed now
    assert capsys.readouterr().err.count('lazylab: warning') == 1


@contextlib.contextmanager
def tiny_server(status: int, body: bytes, raw: bool = False):
    """An HTTP server on 127.0.0.1 (a free port, yielded) answering every GET and POST with `status` and `body`
    (raw=True: `body` as the whole reply, not HTTP), and the requests it got in `tiny_server.paths` (their
    X-Lazylab-Token headers in `tiny_server.tokens`)."""
    import http.server
    import threading
    paths = tiny_server.paths = []
    tokens = tiny_server.tokens = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self):
            paths.append((self.command, self.path))
            tokens.append(self.headers.get('X-Lazylab-Token'))
            if raw:
                self.wfile.write(body)
                return
            self.send_response(status)
            self.send_header('Content-Type', 'application/json')
            self.send_header('Content-Length', str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize('status, body, raw, why', [
    (404, b'{"detail": "Not Found"}', False, 'answers HTTP 404'),
    (200, b'<html>hello</html>', False, "answers with something that is not labml's JSON"),
    (200, b'garbage, not HTTP\r\n\r\n', True, 'does not answer as a web server'),
], ids=['404', 'html', 'garbage'])
def test_a_server_that_answers_but_is_not_labml_costs_one_warning_and_a_few_seconds(capsys, status, body, raw, why):
    with tiny_server(status, body, raw) as port:
        assert dashboard.app_writer(f'http://127.0.0.1:{port}') is None
        asked = list(tiny_server.paths)
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and err.startswith('lazylab: warning: ') and why in err, err
    assert 'it is not a labml dashboard; training without it' in err
    # the runs query, then labml's own track post (nothing sent for a run), and no retries: two requests, each
    # answered at once here (so a few seconds at most, where labml's client alone retried for ~30 s)
    assert asked == [('GET', '/api/v1/runs/default'), ('POST', '/api/v1/default/track?run_uuid=&labml_version=0')]


def test_a_labml_app_that_answers_only_its_track_post_is_accepted(capsys):
    """A labml app that wants a login for the runs listing still answers its client's track post as JSON."""
    with tiny_server(200, b'{"errors": [{"error": "invalid_run_uuid"}]}') as port:
        assert dashboard.app_writer(f'http://127.0.0.1:{port}/api/v1/TOKEN') == \
            f'http://127.0.0.1:{port}/api/v1/TOKEN'
    assert capsys.readouterr().err == ''


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


LABML_RUNS = b'{"runs": [], "labml_token": "default"}'


def test_the_token_goes_to_the_dashboard_and_nowhere_else(monkeypatch, capsys):
    """With $LAZYLAB_DASHBOARD_TOKEN, every urllib request of this process to the dashboard (labml's uploads go
    through urllib.request.urlopen) carries it; a request to another server does not."""
    import urllib.request
    monkeypatch.setattr(urllib.request, '_opener', None)  # the process-wide opener, restored after the test
    monkeypatch.setenv('LAZYLAB_DASHBOARD_TOKEN', 'T' * 20)
    with tiny_server(200, LABML_RUNS) as other:
        other_tokens = tiny_server.tokens
        with tiny_server(200, LABML_RUNS) as port:
            assert dashboard.app_writer(f'http://127.0.0.1:{port}') == f'http://127.0.0.1:{port}/api/v1/default'
            urllib.request.urlopen(f'http://127.0.0.1:{port}/api/v1/default/track', b'[]', timeout=10).read()
            assert tiny_server.tokens == ['T' * 20, 'T' * 20]
        urllib.request.urlopen(f'http://127.0.0.1:{other}/', timeout=10).read()
        assert other_tokens == [None]
    assert capsys.readouterr().err == ''


def test_a_dashboard_that_wants_a_token_costs_one_warning(monkeypatch, capsys):
    monkeypatch.delenv('LAZYLAB_DASHBOARD_TOKEN', raising=False)
    with tiny_server(401, b'{"error": "this dashboard needs its token"}') as port:
        assert dashboard.app_writer(f'http://127.0.0.1:{port}') is None
        assert tiny_server.paths == [('GET', '/api/v1/runs/default')]  # no second question
    assert capsys.readouterr().err == (f'lazylab: warning: labml dashboard at http://127.0.0.1:{port} refuses '
                                       f'requests without its token; training without it (set '
                                       f'LAZYLAB_DASHBOARD_TOKEN to its --token)\n')
