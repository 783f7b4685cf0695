"""`lazylab dashboard`'s user errors, checked before anything is bound or written: one line, exit code 2 from `main`,
a DashboardError (a ValueError) from `run`."""
import socket
import sys

import pytest

from lazylab import dashboard
from lazylab.dashboard import DashboardError, server


def test_busy_port_is_a_one_line_error(capsys):
    with socket.socket() as busy:
        busy.bind(('127.0.0.1', 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert dashboard.main(['--port', str(port)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f'lazylab: error: 127.0.0.1:{port} is already in use; choose another --port']


def test_missing_extra_says_what_to_install(monkeypatch, capsys, ports):
    monkeypatch.setitem(sys.modules, 'labml_app', None)  # makes `import labml_app` raise ImportError
    assert dashboard.main(['--port', str(ports.free())]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'lazylab[dashboard]'" in err[0]


@pytest.mark.parametrize('flags, message', [
    (['--port', '0'], '--port must be in 1..65535, got 0'),
    (['--port', '65536'], '--port must be in 1..65535, got 65536'),
], ids=['port-0', 'port-65536'])
def test_port_out_of_range_is_a_dashboard_error(flags, message):
    with pytest.raises(DashboardError) as e:
        server.run(flags)
    assert str(e.value) == message and isinstance(e.value, ValueError)


@pytest.mark.parametrize('flags, message', [
    (['--port', 'abc'], "lazylab dashboard: argument --port: invalid int value: 'abc'"),
    (['--store', '{tmp}/notes.txt'], "--store '{tmp}/notes.txt': {tmp}/notes.txt is a file, not a folder"),
    (['--store', '{tmp}/notes.txt/store'], "--store '{tmp}/notes.txt/store': {tmp}/notes.txt is a file, not a folder"),
    (['--store', ''], "--store '': give a folder"),
], ids=['port-not-a-number', 'store-a-file', 'store-in-a-file', 'store-empty'])
def test_bad_flags_are_one_line_and_write_nothing(tmp_path, capsys, flags, message, ports):
    (tmp_path / 'notes.txt').write_text('not a folder\n')
    flags = [f.format(tmp=tmp_path) for f in flags]
    assert dashboard.main(['--port', str(ports.free()), *flags]) == 2
    assert capsys.readouterr().err == f'lazylab: error: {message.format(tmp=tmp_path)}\n'
    assert [p.name for p in tmp_path.iterdir()] == ['notes.txt']


def test_assets_folder_missing_files_is_a_dashboard_error(tmp_path, ports):
    (tmp_path / 'd3.v6.min.js').write_text('')
    store = tmp_path / 'store'
    with pytest.raises(DashboardError) as e:
        server.run(['--port', str(ports.free()), '--assets', str(tmp_path), '--store', str(store)])
    assert str(e.value) == (f'--assets {tmp_path} lacks bootstrap.min.css, fontawesome/css/all.css, '
                            'fontawesome/webfonts')
    assert not store.exists()  # nothing written


def test_main_prints_a_dashboard_error_as_one_line(capsys, monkeypatch):
    def fail(argv):
        raise DashboardError('some mistake')
    monkeypatch.setattr(server, 'run', fail)
    assert dashboard.main([]) == 2
    assert capsys.readouterr().err == 'lazylab: error: some mistake\n'
