"""The fixtures tests/conftest.py shares: the ports helper's wait gives up with the server's output, the short run
is a finished run, cli_error takes one error line only, and every test leaves the thread count as it found it."""
import json
import socket
import subprocess
import sys

import pytest
import torch

from lazylab.testing import keep_threads


def test_wait_for_a_port_returns_once_it_accepts_and_reports_a_server_that_died(ports):
    with socket.socket() as listening:
        listening.bind(('127.0.0.1', 0))
        listening.listen()
        port = listening.getsockname()[1]
        idle = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])
        try:
            ports.wait(port, idle)  # something accepts on the port: no wait
            assert idle.poll() is None and ports.is_open(port)
        finally:
            idle.kill()
            idle.wait()
    port = ports.free()
    assert not ports.is_open(port)
    dying = subprocess.Popen([sys.executable, '-c', 'print("no such store"); raise SystemExit(3)'],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with pytest.raises(AssertionError) as e:
        ports.wait(port, dying, 'the dashboard')
    assert str(e.value) == f'the dashboard did not start on port {port} (exit code 3): no such store\n'


def test_short_run_is_a_finished_three_step_run(short_run):
    info = json.loads((short_run / 'run.json').read_text())
    assert (info['experiment'], info['status'], info['steps']) == ('transformer', 'completed', 3)
    assert (short_run / 'checkpoint.pt').is_file() and (short_run / 'configs.yaml').is_file()


def test_cli_error_returns_the_one_error_message_and_refuses_anything_else(cli_error):
    assert cli_error(['train', 'transformr']).startswith("unknown experiment 'transformr'; did you mean 'transformer'?")
    with pytest.raises(AssertionError):  # exit code 0 is not an error
        cli_error(['options', 'transformer'])


def test_keep_threads_puts_back_the_thread_count_a_block_changed():
    # what the autouse fixture of tests/conftest.py wraps every test in
    before = torch.get_num_threads()
    with keep_threads():
        torch.set_num_threads(2 if before == 1 else 1)
        inside = torch.get_num_threads()
    assert inside != before and torch.get_num_threads() == before
