"""lazylab/labml/session.py in this process (labml's singletons put back afterwards: tests/labml/conftest.py): the run
directory is made through lazylab.runs when the script starts its experiment, a new id when another run took the
first one, with labml's run moved into it; run.json is one RunRecord, written atomically."""
import json
import sys

import pytest

from lazylab import runs
from lazylab.labml import runner

pytestmark = pytest.mark.usefixtures('labml_state')

SCRIPT = '''
import torch
from labml import experiment, tracker
from lazylab.configs import BaseConfigs


class Configs(BaseConfigs):
    steps: int = 3
    lr: float = 0.1


def main():
    conf = Configs()
    experiment.create(name='tiny_script', writers={'screen'})
    experiment.configs(conf, {'steps': 4})
    w = torch.nn.Parameter(torch.tensor(1.0))
    opt = torch.optim.SGD([w], lr=conf.lr)
    with experiment.start():
        for i in range(conf.steps):
            loss = w ** 2
            opt.zero_grad()
            loss.backward()
            opt.step()
            tracker.save(i, {'loss.train': loss.item()})
'''


@pytest.fixture
def script(tmp_path):
    path = tmp_path / 'tiny_script.py'
    path.write_text(SCRIPT, encoding='utf-8')
    yield path
    sys.modules.pop('tiny_script', None)
    if str(tmp_path) in sys.path:
        sys.path.remove(str(tmp_path))


def test_a_run_id_taken_by_another_run_is_drawn_again_and_labmls_run_moves_with_it(tmp_path, script, monkeypatch,
                                                                                    capsys):
    taken = tmp_path / 'runs' / 'tiny_script' / '20260101-000000-aaaa'
    taken.mkdir(parents=True)
    (taken / 'theirs.txt').write_text('another run\n')
    ids = iter(['20260101-000000-aaaa', '20260101-000000-bbbb'])
    monkeypatch.setattr(runs, 'new_run_id', lambda: next(ids))
    runner.run_labml(str(script), ['lr=0.25'], steps=2, runs_dir=str(tmp_path / 'runs'), argv=('tiny_script.py',))
    run_dir = tmp_path / 'runs' / 'tiny_script' / '20260101-000000-bbbb'
    assert sorted(p.name for p in taken.iterdir()) == ['theirs.txt']  # the other run's folder, untouched
    record = json.loads((run_dir / runs.RUN_JSON).read_text())
    labml_run = run_dir / record['labml_run']
    assert record['labml_run'] == f'labml/tiny_script/{record["uuid"]}'
    assert (labml_run / 'run.yaml').is_file() and (labml_run / 'configs.yaml').is_file()
    assert (record['experiment'], record['source']) == \
        ('tiny_script', {'kind': 'labml', 'module': 'tiny_script', 'path': str(script.resolve())})
    assert (record['run_id'], record['status'], record['steps'], record['argv']) == \
        (run_dir.name, 'completed', 2, ['tiny_script.py'])
    assert set(record) == {'experiment', 'source', 'run_id', 'uuid', 'labml_run', 'steps', 'argv', 'created',
                           'status', 'finished', 'lazylab', 'torch', 'python'} | ({'git'} & set(record))
    metrics = [json.loads(line) for line in (run_dir / runs.METRICS_JSONL).read_text().splitlines()]
    assert [m['step'] for m in metrics] == [0, 1]  # 2 steps of the script's 4
    assert metrics[0]['loss.train'] == 1.0 and metrics[1]['loss.train'] == pytest.approx((1 - 2 * 0.25) ** 2)
    assert [p.name for p in run_dir.iterdir() if p.name.endswith('.tmp')] == []
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == (f'lazylab labml: completed after 2 optimizer steps; loss.train 1.0000 → 0.2500; '
                                    f'run dir {run_dir}')


def test_the_end_of_a_run_whose_run_json_is_gone_is_one_warning(tmp_path, script, monkeypatch, capsys):
    from lazylab.labml import session as session_module
    original = session_module.Session.finish

    def finish_and_lose_run_json(self):
        original(self)
        if self.run_dir is not None and (self.run_dir / runs.RUN_JSON).exists():
            (self.run_dir / runs.RUN_JSON).unlink()

    monkeypatch.setattr(session_module.Session, 'finish', finish_and_lose_run_json)
    runner.run_labml(str(script), runs_dir=str(tmp_path / 'runs'))
    # (other warnings may come first: labml_nn imported by an earlier test of this process, say)
    warnings = [line for line in capsys.readouterr().err.splitlines() if 'cannot record' in line]
    assert len(warnings) == 1 and warnings[0].startswith('lazylab: warning: cannot record the end of the run in ')
    assert 'no run.json' in warnings[0]
