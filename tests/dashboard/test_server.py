"""`lazylab dashboard`'s user errors, checked before anything is bound or written: one line, exit code 2 from the
command line, a DashboardError (a ValueError) from `lazylab.cli.dashboard.run` (the parser's own mistakes are
UsageErrors)."""
import errno
import socket
import sys

import pytest

from lazylab import cli
from lazylab.cli import dashboard as command
from lazylab.dashboard import DashboardError, server
from lazylab.errors import UsageError


def lazylab_dashboard(argv) -> int:
    return cli.main(['dashboard', *argv])


def test_busy_port_is_a_one_line_error(capsys):
    with socket.socket() as busy:
        busy.bind(('127.0.0.1', 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert lazylab_dashboard(['--port', str(port)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f'lazylab: error: 127.0.0.1:{port} is already in use; choose another --port']


@pytest.mark.parametrize('host', ['256.1.1.1', '127.0.0.1.5', '::zz'])
def test_a_host_that_is_not_an_address_is_named_as_such_not_as_a_busy_port(capsys, ports, host):
    # refused before any name lookup: nothing leaves the machine
    assert lazylab_dashboard(['--host', host, '--port', str(ports.free())]) == 2
    assert capsys.readouterr().err == f'lazylab: error: --host {host} is not an IP address\n'


def test_a_port_below_1024_without_root_says_permission_denied(capsys, monkeypatch, tmp_path):
    def refuse(self, address):
        raise PermissionError(errno.EACCES, 'Permission denied')
    monkeypatch.setattr(socket.socket, 'bind', refuse)  # as for a user who is not root, on port 80
    assert lazylab_dashboard(['--port', '80', '--store', str(tmp_path)]) == 2
    assert capsys.readouterr().err == ('lazylab: error: 127.0.0.1:80: permission denied (ports below 1024 need '
                                       'root); choose another --port\n')


def test_missing_extra_says_what_to_install(monkeypatch, capsys, ports):
    monkeypatch.setitem(sys.modules, 'labml_app', None)  # makes `import labml_app` raise ImportError
    assert lazylab_dashboard(['--port', str(ports.free())]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'lazylab[dashboard]'" in err[0]


@pytest.mark.parametrize('flags, message', [
    (['--port', '0'], '--port must be in 1..65535, got 0'),
    (['--port', '65536'], '--port must be in 1..65535, got 65536'),
], ids=['port-0', 'port-65536'])
def test_port_out_of_range_is_a_dashboard_error(flags, message):
    with pytest.raises(DashboardError) as e:
        command.run(flags)
    assert str(e.value) == message and isinstance(e.value, ValueError)


@pytest.mark.parametrize('flags, message', [
    (['--port', 'abc'], "argument --port: invalid int value: 'abc' (see: lazylab dashboard --help)"),
    (['--store', '{tmp}/notes.txt'], "--store '{tmp}/notes.txt': {tmp}/notes.txt is a file, not a folder"),
    (['--store', '{tmp}/notes.txt/store'], "--store '{tmp}/notes.txt/store': {tmp}/notes.txt is a file, not a folder"),
    (['--store', ''], "--store '': give a folder"),
    (['--runs-dir', '{tmp}/notes.txt'], "--runs-dir '{tmp}/notes.txt': {tmp}/notes.txt is a file, not a folder"),
    (['--runs-dir', '{tmp}/notes.txt/runs'], "--runs-dir '{tmp}/notes.txt/runs': {tmp}/notes.txt is a file, not a "
                                             "folder"),
    (['--studies-port', '70000'], '--studies-port must be in 1..65535, got 70000'),
], ids=['port-not-a-number', 'store-a-file', 'store-in-a-file', 'store-empty', 'runs-dir-a-file', 'runs-dir-in-a-file',
        'studies-port-out-of-range'])
def test_bad_flags_are_one_line_and_write_nothing(tmp_path, capsys, flags, message, ports):
    (tmp_path / 'notes.txt').write_text('not a folder\n')
    flags = [f.format(tmp=tmp_path) for f in flags]
    assert lazylab_dashboard(['--port', str(ports.free()), *flags]) == 2
    assert capsys.readouterr().err == f'lazylab: error: {message.format(tmp=tmp_path)}\n'
    assert [p.name for p in tmp_path.iterdir()] == ['notes.txt']


def test_the_studies_port_is_checked_like_the_port(capsys, ports):
    port = ports.free()
    assert lazylab_dashboard(['--port', str(port), '--studies-port', str(port)]) == 2
    assert capsys.readouterr().err == (f"lazylab: error: --studies-port {port} is the labml dashboard's --port; "
                                       f"choose another\n")
    with socket.socket() as busy:
        busy.bind(('127.0.0.1', 0))
        busy.listen()
        taken = busy.getsockname()[1]
        assert lazylab_dashboard(['--port', str(port), '--studies-port', str(taken)]) == 2
    assert capsys.readouterr().err == (f'lazylab: error: 127.0.0.1:{taken} is already in use; choose another '
                                       f'--studies-port\n')


def test_assets_folder_missing_files_is_a_dashboard_error(tmp_path, ports):
    (tmp_path / 'd3.v6.min.js').write_text('')
    store = tmp_path / 'store'
    with pytest.raises(DashboardError) as e:
        command.run(['--port', str(ports.free()), '--studies-port', str(ports.free()), '--assets', str(tmp_path),
                     '--store', str(store)])
    assert str(e.value) == (f'--assets {tmp_path} lacks bootstrap.min.css, fontawesome/css/all.css, '
                            'fontawesome/webfonts')
    assert not store.exists()  # nothing written


def test_main_prints_a_dashboard_error_as_one_line(capsys, monkeypatch):
    def fail(*args, **kwargs):
        raise DashboardError('some mistake')
    monkeypatch.setattr(server, 'run', fail)
    assert lazylab_dashboard([]) == 2
    assert capsys.readouterr().err == 'lazylab: error: some mistake\n'


@pytest.fixture
def started(monkeypatch):
    """`server.run` up to the point where it would serve: the port check and `serve` replaced (nothing is bound);
    returns the keyword arguments `serve` got, once it has been called."""
    got = {}
    monkeypatch.setattr(server, '_bind_problem', lambda host, port, flag: None)
    monkeypatch.setattr(server, 'serve', lambda store, host, port, assets, **kw: got.update(host=host, **kw))
    monkeypatch.delenv('LAZYLAB_DASHBOARD_TOKEN', raising=False)
    return got


@pytest.mark.parametrize('host', ['0.0.0.0', '::'])
def test_a_host_that_is_not_loopback_warns_there_is_no_authentication(started, capsys, tmp_path, host):
    command.run(['--host', host, '--store', str(tmp_path)])
    assert capsys.readouterr().err == (
        f'lazylab: warning: --host {host} is not a loopback address and the dashboard has no authentication: '
        f'anyone who reaches this port can read and change it (add --token, or keep 127.0.0.1)\n')
    assert started['host'] == host and started['token'] is None
    command.run(['--host', host, '--store', str(tmp_path), '--token', 'x' * 16])
    assert capsys.readouterr().err == (
        f'lazylab: warning: --host {host} is not a loopback address: the dashboard speaks plain HTTP, so its token '
        f'can be read on the way by anyone on the network\n')


@pytest.mark.parametrize('host', ['127.0.0.1', '127.0.0.2', '::1', '[::1]', 'localhost', 'LOCALHOST'])
def test_a_loopback_host_does_not_warn(started, capsys, tmp_path, host):
    command.run(['--host', host, '--store', str(tmp_path)])
    assert capsys.readouterr().err == '' and started['host'] == host


def test_body_limit_and_token_reach_the_server(started, monkeypatch, tmp_path):
    command.run(['--store', str(tmp_path)])
    assert (started['max_body_bytes'], started['token'], started['header_timeout_s']) == (16 << 20, None, 10)
    command.run(['--store', str(tmp_path), '--max-body-mb', '3', '--token', 'T' * 20, '--header-timeout', '2.5'])
    assert (started['max_body_bytes'], started['token'], started['header_timeout_s']) == (3 << 20, 'T' * 20, 2.5)
    monkeypatch.setenv('LAZYLAB_DASHBOARD_TOKEN', 'from-the-environment')
    command.run(['--store', str(tmp_path)])
    assert started['token'] == 'from-the-environment'


@pytest.mark.parametrize('flags, message', [
    (['--max-body-mb', '0'], '--max-body-mb must be at least 1, got 0'),
    (['--max-body-mb', '1.5'], "argument --max-body-mb: invalid int value: '1.5' (see: lazylab dashboard --help)"),
    (['--header-timeout', '0'], '--header-timeout must be a positive number of seconds, got 0'),
    (['--header-timeout', 'nan'], '--header-timeout must be a positive number of seconds, got nan'),
    (['--header-timeout', 'inf'], '--header-timeout must be a positive number of seconds, got inf'),
    (['--header-timeout', 'soon'], "argument --header-timeout: invalid float value: 'soon' (see: lazylab dashboard "
                                   "--help)"),
    (['--token', 'short-secret'], '--token (or $LAZYLAB_DASHBOARD_TOKEN): use at least 16 letters, digits or - _ . ~ '
                                  '(e.g. python -c "import secrets; print(secrets.token_urlsafe())")'),
    (['--token', 'sixteen chars; no'], '--token (or $LAZYLAB_DASHBOARD_TOKEN): use at least 16 letters, digits or - '
                                       '_ . ~ (e.g. python -c "import secrets; print(secrets.token_urlsafe())")'),
], ids=['body-0', 'body-float', 'header-timeout-0', 'header-timeout-nan', 'header-timeout-inf',
        'header-timeout-text', 'token-short', 'token-characters'])
def test_bad_guard_flags_are_one_line_and_never_show_the_token(started, tmp_path, flags, message):
    with pytest.raises(UsageError) as e:  # a DashboardError, but for the parser's own
        command.run(['--store', str(tmp_path), *flags])
    assert str(e.value) == message and started == {}


def test_help_says_how_a_browser_passes_the_token(capsys, monkeypatch):
    monkeypatch.setenv('COLUMNS', '1000')  # argparse would break X-Lazylab-Token at a hyphen
    assert lazylab_dashboard(['--help']) == 0  # HelpShown, not SystemExit
    text = capsys.readouterr().out
    assert 'http://HOST:PORT/?token=TOKEN, which sets a cookie (lazylab_token)' in text
    assert 'send the header X-Lazylab-Token: TOKEN' in text and '--max-body-mb MB' in text
