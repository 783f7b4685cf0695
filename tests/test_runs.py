"""lazylab.runs: run ids without a race, atomic JSON, the run record, and the locks."""
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from lazylab import locks, runs
from lazylab.errors import UsageError


def test_run_ids_sort_by_time_and_carry_four_hex_digits():
    rid = runs.new_run_id()
    date, clock, suffix = rid.split('-')
    assert len(date) == 8 and len(clock) == 6 and len(suffix) == 4
    int(suffix, 16)


def test_make_run_dir_gives_each_of_many_concurrent_callers_its_own_folder(tmp_path, monkeypatch):
    # every caller draws the same id first: the exclusive mkdir makes all but one draw again
    ids = iter(['20261201-000000-aaaa'] * 8 + [f'20261201-000000-{i:04x}' for i in range(100)])
    lock = threading.Lock()

    def drawn():
        with lock:
            return next(ids)

    monkeypatch.setattr(runs, 'new_run_id', drawn)
    made: list[Path] = []
    barrier = threading.Barrier(8)

    def start():
        barrier.wait()
        made.append(runs.make_run_dir(tmp_path / 'new' / 'exp'))

    threads = [threading.Thread(target=start) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 8 and len(set(made)) == 8
    assert all(p.is_dir() and p.parent == tmp_path / 'new' / 'exp' for p in made)


def test_make_run_dir_under_a_file_is_one_error_and_removes_what_it_made(tmp_path):
    (tmp_path / 'a').mkdir()
    (tmp_path / 'a' / 'file').write_text('x')
    made: list[Path] = []
    with pytest.raises(UsageError, match='is a file, not a folder'):
        runs.make_run_dir(tmp_path / 'a' / 'file' / 'exp', made)
    assert made == [] and sorted(p.name for p in (tmp_path / 'a').iterdir()) == ['file']
    made = []
    with pytest.raises(UsageError):
        runs.make_run_dir(tmp_path / 'b' / 'c' / 'file2' / 'x', made, attempts=0)
    assert not (tmp_path / 'b').exists()  # b and c were made by the call, and removed again


def test_write_json_replaces_whole_and_leaves_no_temporary_file_when_it_fails(tmp_path, monkeypatch):
    path = tmp_path / 'run.json'
    runs.write_json(path, {'a': 1})
    runs.write_json(path, {'a': 2, 'b': [1, 2]})
    assert json.loads(path.read_text()) == {'a': 2, 'b': [1, 2]}

    def full(*args, **kwargs):
        raise OSError(28, 'No space left on device')

    monkeypatch.setattr(os, 'replace', full)
    with pytest.raises(OSError, match='No space'):
        runs.write_json(path, {'a': 3})
    assert json.loads(path.read_text()) == {'a': 2, 'b': [1, 2]}
    assert sorted(p.name for p in tmp_path.iterdir()) == ['run.json']


def test_read_record_names_a_missing_or_damaged_run_json(tmp_path):
    with pytest.raises(UsageError, match='not a lazylab run directory'):
        runs.read_record(tmp_path)
    (tmp_path / 'run.json').write_text('{"half": ')
    with pytest.raises(UsageError, match=r'run\.json is damaged'):
        runs.read_record(tmp_path)
    (tmp_path / 'run.json').write_text('[1, 2]')
    with pytest.raises(UsageError, match='damaged'):
        runs.read_record(tmp_path)
    runs.write_record(tmp_path, {'experiment': 'x', 'status': 'running'})
    assert runs.update_record(tmp_path, status='completed', steps=3) == {'experiment': 'x', 'status': 'completed',
                                                                          'steps': 3}
    assert runs.read_record(tmp_path)['status'] == 'completed'


def test_environment_reads_versions_without_importing_torch():
    code = ('import sys; from lazylab import runs; e = runs.environment(); '
            'print(e["python"], "torch" in sys.modules, bool(e["torch"]))')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True).stdout.split()
    import platform
    assert out == [platform.python_version(), 'False', 'True']


def _holder(path: Path) -> subprocess.Popen:
    code = (f'import sys, time; from lazylab import locks\n'
            f'with locks.exclusive_lock({str(path)!r}, "busy"):\n'
            f'    print("held", flush=True); time.sleep(60)\n')
    p = subprocess.Popen([sys.executable, '-c', code], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == 'held'
    return p


def test_an_exclusive_lock_refuses_a_second_process_until_the_first_dies(tmp_path):
    p = _holder(tmp_path)
    try:
        assert locks.lock_is_held(tmp_path)
        with pytest.raises(locks.Locked, match='^RUN is busy$'):
            with locks.exclusive_lock(tmp_path, 'RUN is busy'):
                pass
    finally:
        p.kill()  # SIGKILL: the kernel drops the lock
        p.wait()
    assert not locks.lock_is_held(tmp_path)
    with locks.exclusive_lock(tmp_path, 'busy'):
        assert locks.lock_is_held(tmp_path)  # another open file of this process sees the flock too
    held = locks.hold_lock(tmp_path / 'owner', 'owner busy', create=True)
    with pytest.raises(locks.Locked, match='owner busy'):
        locks.hold_lock(tmp_path / 'owner', 'owner busy')
    held.release()
    locks.hold_lock(tmp_path / 'owner', 'owner busy').release()


def test_a_lock_file_that_cannot_be_opened_counts_as_held(tmp_path):
    assert locks.lock_is_held(tmp_path / 'missing')


def test_removing_what_a_failed_start_made_keeps_a_run_started_beside_it(tmp_path):
    made: list[Path] = []
    mine = runs.make_run_dir(tmp_path / 'r' / 'exp', made)
    (mine / 'run.json').write_text('{}')
    other = runs.make_run_dir(tmp_path / 'r' / 'exp')  # another process, at the same moment, in our new parents
    (other / 'run.json').write_text('{}')
    runs.remove_made(made, run_dir=mine)
    assert not mine.exists() and (other / 'run.json').is_file()


def test_a_runs_speed_is_its_tokens_over_its_seconds_as_trains_last_line_says_it(tmp_path):
    # by hand: 100 tokens at 100 tok/s (1 s), then 200 more at 50 tok/s (4 s): 300 tokens in 5 s = 60 tok/s, where
    # the plain mean of the two speeds would say 75
    (tmp_path / 'run.json').write_text('{"experiment": "transformer", "status": "completed"}')
    (tmp_path / 'metrics.jsonl').write_text('{"step": 1, "tokens": 100, "tokens_per_s": 100.0}\n'
                                            '{"step": 2, "tokens": 300, "tokens_per_s": 50.0, "loss.valid": 1.0}\n')
    assert runs.load_run(tmp_path).tokens_per_s() == pytest.approx(60.0, rel=1e-12)
    # records that count no tokens (a `lazylab labml` run): the mean of their speeds
    (tmp_path / 'metrics.jsonl').write_text('{"step": 1, "tokens_per_s": 100.0}\n{"step": 2, "tokens_per_s": 50.0}\n')
    assert runs.load_run(tmp_path).tokens_per_s() == pytest.approx(75.0, rel=1e-12)


def test_compare_shows_the_speed_the_done_line_of_train_showed(tmp_path, capsys):
    from lazylab import cli
    assert cli.main(['train', 'transformer', 'd_model=16', 'n_layers=1', 'seq_len=16', 'batch_size=4', 'max_steps=30',
                     'log_interval=7', 'valid_interval=15', 'device=cpu', 'threads=1', 'dashboard=',
                     f'runs_dir={tmp_path}']) == 0
    done = capsys.readouterr().out.splitlines()[-1]
    speed = done.split(' tokens/s (the run')[0].rsplit(', ', 1)[1]
    (run,) = (tmp_path / 'transformer').iterdir()
    assert abs(runs.load_run(run).tokens_per_s() - float(speed.replace(',', ''))) <= 0.5 + 1e-6  # (it is rounded)
