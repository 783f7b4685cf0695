"""Data-parallel training with torchrun (lazylab.experiments.distributed), on the CPU with gloo.

The multi-process checks run real `torchrun --standalone --nproc_per_node=2` jobs as subprocesses:
- this file run as a torchrun script (`python -m torch.distributed.run … test_distributed.py MODE OUT`), for the
  model-level checks: DDP gradients of every model equal the single-process gradient of the combined batch, the
  all-reduce / broadcast / batch-share helpers, the replica check, and an exception on one rank;
- `-m lazylab.experiments.transformer …` end to end: two processes equal one process on the combined batches,
  a killed rank ends the job, and the killed run resumes exactly.
Every subprocess runs in its own session and is killed (with torchrun's workers, which start sessions of their
own) in a `finally`, so nothing is left running whatever happens.
"""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lazylab.experiments import distributed as D

ROOT = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, '-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2',
            '--monitor-interval=0.1']


# ---------------------------------------------------------------------------------------------------------------
# Helpers: run a job, find and kill its processes
# ---------------------------------------------------------------------------------------------------------------

def _children(pid: int) -> list[int]:
    """PIDs whose parent is `pid` (from /proc; torchrun's workers are its direct children)."""
    out = []
    for d in Path('/proc').iterdir():
        if d.name.isdigit():
            try:
                stat = (d / 'stat').read_text()
            except OSError:
                continue
            # the command name (field 2) may hold spaces; ppid is the 2nd field after its closing parenthesis
            if int(stat.rsplit(')', 1)[1].split()[1]) == pid:
                out.append(int(d.name))
    return out


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class Job:
    """A subprocess in its own session; `close()` kills it, its workers and their sessions."""

    def __init__(self, args: list[str], cwd: Path, env: Optional[dict[str, str]] = None):
        self.workers: list[int] = []
        env = {**os.environ, 'PYTHONPATH': str(ROOT), 'OMP_NUM_THREADS': '1', 'LABML_DISABLE_GIT': '1',
               **(env or {})}
        self.proc = subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, start_new_session=True)

    def find_workers(self, n: int, within: float = 120) -> list[int]:
        deadline = time.time() + within
        while time.time() < deadline and self.proc.poll() is None:
            self.workers = _children(self.proc.pid)
            if len(self.workers) >= n:
                return self.workers
            time.sleep(0.05)
        raise AssertionError(f'torchrun did not start {n} workers: {self.output()}')

    def wait(self, within: float) -> int:
        try:
            self.proc.wait(timeout=within)
        except subprocess.TimeoutExpired:
            raise AssertionError(f'job still running after {within} s:\n{self.output()}') from None
        return self.proc.returncode

    def output(self) -> str:
        if self.proc.poll() is None:
            return '(still running)'
        return self.proc.stdout.read() if self.proc.stdout else ''

    def close(self) -> None:
        self.workers += _children(self.proc.pid) if self.proc.poll() is None else []
        _kill_session(self.proc.pid)
        for pid in self.workers:
            _kill_session(pid)
        self.proc.wait(timeout=30)
        if self.proc.stdout:
            self.proc.stdout.close()


def run(args: list[str], cwd: Path, within: float = 240) -> str:
    """Run a job to the end; returns its output; fails the test on a non-zero exit."""
    job = Job(args, cwd)
    try:
        rc = job.wait(within)
        out = job.output()
        assert rc == 0, f'exit code {rc}:\n{out}'
        return out
    finally:
        job.close()


# ---------------------------------------------------------------------------------------------------------------
# In one process
# ---------------------------------------------------------------------------------------------------------------

def test_environment_single_process_without_torchrun_variables(monkeypatch):
    for name in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK'):
        monkeypatch.delenv(name, raising=False)
    env = D.environment()
    assert (env.rank, env.world_size, env.local_rank, env.is_main, env.enabled) == (0, 1, 0, True, False)
    assert D.setup(torch.device('cpu')) == env and not torch.distributed.is_initialized()
    assert D.wrap(model := torch.nn.Linear(2, 2), torch.device('cpu')) is model
    assert D.all_reduce_sum(1.5, 2.0) == (1.5, 2.0)
    assert D.broadcast_object({'a': 1}) == {'a': 1} and D.all_gather_object(7) == [7]
    assert D.is_main_process()


def test_environment_reads_torchrun_variables(monkeypatch):
    monkeypatch.setenv('RANK', '3')
    monkeypatch.setenv('WORLD_SIZE', '4')
    monkeypatch.setenv('LOCAL_RANK', '1')
    env = D.environment()
    assert (env.rank, env.world_size, env.local_rank, env.is_main, env.enabled) == (3, 4, 1, False, True)


@pytest.mark.parametrize('variables, culprit', [({'RANK': '0'}, 'RANK and WORLD_SIZE'),
                                                ({'RANK': 'x', 'WORLD_SIZE': '2'}, "RANK='x'"),
                                                ({'RANK': '2', 'WORLD_SIZE': '2'}, 'RANK=2, WORLD_SIZE=2')])
def test_environment_errors_name_the_variable(monkeypatch, variables, culprit):
    for name in ('RANK', 'WORLD_SIZE', 'LOCAL_RANK'):
        monkeypatch.delenv(name, raising=False)
    for k, v in variables.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(D.DistributedError, match=culprit.replace('(', r'\(')):
        D.environment()


def test_timeout_from_environment(monkeypatch):
    monkeypatch.setenv('LAZYLAB_DIST_TIMEOUT', '42.5')
    assert D.timeout().total_seconds() == 42.5
    monkeypatch.setenv('LAZYLAB_DIST_TIMEOUT', '0')
    with pytest.raises(D.DistributedError, match='LAZYLAB_DIST_TIMEOUT'):
        D.timeout()


BAD_TIMEOUTS = [('abc', "LAZYLAB_DIST_TIMEOUT='abc' is not a number of seconds"),
                *[(v, f"LAZYLAB_DIST_TIMEOUT must be a finite number of seconds in (0, 3.1536e+07], got '{v}'")
                  for v in ('nan', 'inf', '-inf', '-1', '0', '1e18')]]


@pytest.mark.parametrize('value, message', BAD_TIMEOUTS)
@pytest.mark.parametrize('env', [D.DistEnv(), D.DistEnv(rank=0, world_size=2, local_rank=0)],
                         ids=['one process', 'under torchrun'])
def test_a_bad_timeout_is_refused_by_setup_with_or_without_torchrun(monkeypatch, value, message, env):
    """`setup` reads LAZYLAB_DIST_TIMEOUT in every process (nan and inf were a ValueError and an OverflowError
    of timedelta under torchrun; any value was ignored without it), before it joins a process group."""
    monkeypatch.setenv('LAZYLAB_DIST_TIMEOUT', value)
    with pytest.raises(D.DistributedError) as caught:
        D.setup(torch.device('cpu'), env)
    assert str(caught.value) == message
    assert not torch.distributed.is_initialized()


@pytest.mark.parametrize('value, message', BAD_TIMEOUTS[:3])
def test_train_with_a_bad_timeout_is_one_line_and_writes_nothing(tmp_path, cli_error, monkeypatch, value, message):
    monkeypatch.setenv('LAZYLAB_DIST_TIMEOUT', value)
    runs = tmp_path / 'runs'
    assert cli_error(['train', 'transformer', 'd_model=16', 'heads=2', 'd_ff=32', 'n_layers=1', 'seq_len=16',
                      'batch_size=4', 'device=cpu', 'threads=1', 'max_steps=1', f'runs_dir={runs}']) == message
    assert not runs.exists()


def test_setup_refuses_mps_and_a_foreign_gpu_index():
    env = D.DistEnv(rank=1, world_size=2, local_rank=1)
    with pytest.raises(D.DistributedError, match='mps'):
        D.setup(torch.device('mps'), env)
    with pytest.raises(D.DistributedError, match='cuda:LOCAL_RANK'):
        D.setup(torch.device('cuda', 0), env)


def test_parameter_digest_sees_a_one_ulp_change():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    before = D.parameter_digest(model)
    with torch.no_grad():
        model.bias[1] = torch.nextafter(model.bias[1], torch.tensor(2.0))
    assert D.parameter_digest(model) != before


@settings(max_examples=25, deadline=None)
@given(n_slots=st.integers(2, 60), seq_len=st.integers(1, 5), batch=st.integers(1, 4), world=st.integers(2, 4),
       extra=st.integers(0, 4), epoch=st.integers(0, 3))
def test_rank_batches_are_disjoint_and_together_make_the_single_process_batch(n_slots, seq_len, batch, world,
                                                                              extra, epoch):
    """Batch b of ranks 0..N-1 (batch_size B) = batch b of one process with batch_size N·B, for every full batch;
    and over an epoch no window start is taken by two ranks."""
    from lazylab.data import ShuffledLoader
    data = torch.arange(n_slots * seq_len + 1 + min(extra, seq_len - 1))  # token id = position: windows readable
    if n_slots < world:
        return
    single = list(ShuffledLoader(data, seq_len=seq_len, batch_size=world * batch, seed=5).epoch(epoch))
    ranks = [list(ShuffledLoader(data, seq_len=seq_len, batch_size=batch, seed=5, rank=r, world_size=world)
                  .epoch(epoch)) for r in range(world)]
    assert len({len(r) for r in ranks}) == 1  # every rank takes the same number of steps
    starts = [x[0].tolist() for r in ranks for x, _ in r]
    flat = [s for batch_starts in starts for s in batch_starts]
    assert len(flat) == len(set(flat)) == (n_slots // world) * world
    full = (n_slots // world) // batch  # batches that are full on every rank
    for b in range(full):
        union = sorted(x[0, i].item() for r in ranks for i in range(batch) for x in [r[b][0]])
        assert union == sorted(single[b][0][0].tolist())
        for r in ranks:  # targets are the inputs shifted by one token
            assert torch.equal(r[b][1], r[b][0] + 1)


# ---------------------------------------------------------------------------------------------------------------
# Two processes: models, helpers and failures (this file run by torchrun)
# ---------------------------------------------------------------------------------------------------------------

def _models(seq_len: int):
    """(name, factory) of each core model family wrapped in AutoregressiveModel (vocab 11, d_model 8)."""
    from lazylab.models.autoregressive import AutoregressiveModel
    from lazylab.models.fast_weights import (
        DPFP,
        FastWeightsAttention,
        FastWeightsAttentionTransformer,
        FastWeightsAttentionTransformerLayer,
    )
    from lazylab.models.feed_forward import FeedForward
    from lazylab.models.feedback import (
        FeedbackAttention,
        FeedbackTransformer,
        FeedbackTransformerKV,
        FeedbackTransformerLayer,
    )
    from lazylab.models.mha import MultiHeadAttention
    from lazylab.models.transformer import Encoder, TransformerLayer
    d, h, f = 8, 2, 16

    def feedback(kv: bool):
        layer = FeedbackTransformerLayer(d_model=d, attn=FeedbackAttention(h, d, 0.0, is_kv_precomputed=kv),
                                         feed_forward=FeedForward(d, f, 0.0), dropout_prob=0.0)
        core = FeedbackTransformerKV(layer, 2, d, h) if kv else FeedbackTransformer(layer, 2)
        return AutoregressiveModel(11, d, core)

    def fast_weights():
        layer = FastWeightsAttentionTransformerLayer(
            d_model=d, attn=FastWeightsAttention(h, d, 0.0, DPFP(nu=1)), feed_forward=FeedForward(d, f, 0.0),
            dropout_prob=0.0)
        return AutoregressiveModel(11, d, FastWeightsAttentionTransformer(layer, 2))

    def transformer():
        from lazylab.models.mha import subsequent_mask

        class Causal(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.encoder = Encoder(TransformerLayer(d_model=d, self_attn=MultiHeadAttention(h, d, 0.0),
                                                        feed_forward=FeedForward(d, f, 0.0), dropout_prob=0.0), 2)

            def forward(self, x):
                return self.encoder(x, subsequent_mask(x.shape[0], x.device))

        return AutoregressiveModel(11, d, Causal())

    return [('feedback', lambda: feedback(False)), ('feedback_kv', lambda: feedback(True)),
            ('fast_weights', fast_weights), ('transformer', transformer)]


def _check_models(out: Path) -> None:
    """Each rank: two SGD steps of DDP on its half of a batch equal two steps of one replica on the whole batch."""
    import torch.nn.functional as F
    rank, world = D.get_rank(), D.get_world_size()
    results = {}
    for seq_len in (1, 5):  # seq_len 1: the feedback attention is never used, so its parameters get no gradient
        for name, make in _models(seq_len):
            torch.manual_seed(0)
            model = make()
            reference = make()
            reference.load_state_dict(model.state_dict())
            ddp = D.wrap(model, torch.device('cpu'))
            assert isinstance(ddp, torch.nn.parallel.DistributedDataParallel)
            opt = torch.optim.SGD(model.parameters(), lr=0.5)
            ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
            g = torch.Generator().manual_seed(1)
            for _step in range(2):
                x = torch.randint(0, 11, (seq_len, 2 * world), generator=g)  # same on every rank
                y = torch.randint(0, 11, (seq_len, 2 * world), generator=g)
                mine = slice(2 * rank, 2 * rank + 2)
                for m, o, xs, ys in ((ddp, opt, x[:, mine], y[:, mine]), (reference, ref_opt, x, y)):
                    o.zero_grad()
                    logits, _ = m(xs)
                    F.cross_entropy(logits.flatten(0, 1), ys.flatten()).backward()
                    o.step()
            unused = sorted(n for n, p in reference.named_parameters() if p.grad is None)
            for (n, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
                where = f'{name}/{seq_len} {n}'
                torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=lambda m, where=where: f'{where}: {m}')
            D.check_replicas_in_sync(model)
            results[f'{name}/{seq_len}'] = {'unused': unused, 'digest': D.parameter_digest(model),
                                            'names': [n for n, _ in model.named_parameters()]}

    # helpers: sums, broadcast, gather, and a column-shared "validation" that adds up to the whole
    assert D.all_reduce_sum(float(rank + 1), 0.5) == (float(sum(range(1, world + 1))), 0.5 * world)
    assert D.broadcast_object({'rank': rank}) == {'rank': 0}
    assert D.all_gather_object(rank * 10) == [r * 10 for r in range(world)]
    batch = torch.arange(3 * 5).view(3, 5)  # [seq_len, batch]: the processes split the columns
    assert D.batch_share(batch).shape == (3, [3, 2][rank])
    assert D.all_reduce_sum(float(D.batch_share(batch).sum())) == (float(batch.sum()),)

    # the replica check fails on every rank, naming rank 1, once rank 1's weights differ
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 3)
    if rank == 1:
        with torch.no_grad():
            model.weight[0, 0] += 1e-3
    try:
        D.check_replicas_in_sync(model)
        results['mismatch'] = 'not detected'
    except D.ReplicaMismatchError as e:
        results['mismatch'] = str(e)
    (out / f'rank{rank}.json').write_text(json.dumps(results))


def _fail_on_rank_1(out: Path) -> None:
    """Rank 1 raises while rank 0 waits in a collective for it."""
    if D.get_rank() == 1:
        time.sleep(0.5)
        raise ValueError('boom on purpose')
    D.all_reduce_sum(1.0)
    (out / 'rank0-passed-the-collective').write_text('')


def _worker_main(mode: str, out: str) -> None:
    with D.process_group(torch.device('cpu')):
        {'models': _check_models, 'fail': _fail_on_rank_1}[mode](Path(out))


@pytest.fixture(scope='module')
def models_job(tmp_path_factory):
    out = tmp_path_factory.mktemp('ddp_models')
    log = run(TORCHRUN + [__file__, 'models', str(out)], cwd=out)
    return out, log


def test_every_model_under_ddp_equals_one_replica_on_the_combined_batch(models_job):
    out, log = models_job
    ranks = [json.loads((out / f'rank{r}.json').read_text()) for r in range(2)]
    for key in [k for k in ranks[0] if '/' in k]:
        assert ranks[0][key]['digest'] == ranks[1][key]['digest'], key  # bitwise-identical replicas
    # the parameters DDP had to cope with: never used in a forward pass, hence without gradient. With seq_len 1
    # the feedback models never attend (the first step has no memory) and never read the memory they write.
    for name in ('feedback/1', 'feedback_kv/1'):
        expected = [n for n in ranks[0][name]['names']
                    if re.match(r'transformer\.(weights|key\.|value\.|layers\.\d\.(attn|norm_self_attn)\.)', n)]
        assert ranks[0][name]['unused'] == sorted(expected) and len(expected) >= 19
    assert ranks[0]['feedback/5']['unused'] == ranks[0]['feedback_kv/5']['unused'] == []
    assert ranks[0]['transformer/1']['unused'] == ranks[0]['transformer/5']['unused'] == []
    # fast weights: labml_nn's layer creates norm_self_attn but never uses it
    assert ranks[0]['fast_weights/5']['unused'] == ['transformer.layers.0.norm_self_attn.bias',
                                                    'transformer.layers.0.norm_self_attn.weight',
                                                    'transformer.layers.1.norm_self_attn.bias',
                                                    'transformer.layers.1.norm_self_attn.weight']


def test_replica_check_names_the_rank_that_differs(models_job):
    out, _ = models_job
    for r in range(2):
        message = json.loads((out / f'rank{r}.json').read_text())['mismatch']
        assert message.startswith('model parameters of rank(s) 1 differ from rank 0'), message


def test_an_exception_on_one_rank_stops_the_job_with_its_message(tmp_path):
    job = Job(TORCHRUN + [__file__, 'fail', str(tmp_path)], cwd=tmp_path, env={'LAZYLAB_DIST_TIMEOUT': '300'})
    try:
        rc = job.wait(within=120)  # far below the 300 s collective timeout: the agent stopped rank 0
        log = job.output()
    finally:
        job.close()
    assert rc != 0
    assert 'lazylab: process rank 1 of 2 stopped (ValueError: boom on purpose)' in log, log
    assert not (tmp_path / 'rank0-passed-the-collective').exists()



# ---------------------------------------------------------------------------------------------------------------
# Two processes end to end: `torchrun … -m lazylab.experiments.transformer`
# ---------------------------------------------------------------------------------------------------------------

# 30 steps, validation + checkpoint every 6, metrics every 3; batch 4 per process (8 for the single process).
E2E = ['d_model=16', 'heads=2', 'd_ff=32', 'n_layers=1', 'seq_len=16', 'max_steps=30', 'valid_interval=6',
       'log_interval=3', 'valid_batches=2', 'final_valid_batches=4', 'sample_tokens=20', 'device=cpu', 'threads=1',
       'optimizer.optimizer=AdamW', 'optimizer.learning_rate=0.01', 'optimizer.warmup=5',
       'optimizer.schedule=cosine']
STEPS = [3, 6, 9, 12, 15, 18, 21, 24, 27, 30]


def _run_dir(runs: Path) -> Path:
    dirs = list((runs / 'transformer').iterdir())
    assert len(dirs) == 1, dirs  # one run directory for the whole job: rank 0 made it
    return dirs[0]


@pytest.fixture(scope='module')
def single_and_ddp(tmp_path_factory):
    """(single-process run dir, two-process run dir, two-process output): batch 8 in one process, 4 in each of 2."""
    from lazylab.experiments.trainer import read_metrics  # noqa: F401  (fail early if the trainer is missing)
    base = tmp_path_factory.mktemp('e2e')
    run([sys.executable, '-m', 'lazylab.experiments.transformer', *E2E, 'batch_size=8', f'runs_dir={base / "one"}'],
        cwd=base)
    log = run(TORCHRUN + ['-m', 'lazylab.experiments.transformer', *E2E, 'batch_size=4',
                          f'runs_dir={base / "two"}'], cwd=base)
    return _run_dir(base / 'one'), _run_dir(base / 'two'), log


def test_two_processes_train_like_one_process_on_the_combined_batches(single_and_ddp):
    from lazylab.experiments.trainer import load_checkpoint, read_metrics
    one, two, log = single_and_ddp
    a, b = read_metrics(one / 'metrics.jsonl'), read_metrics(two / 'metrics.jsonl')
    assert [r['step'] for r in a] == [r['step'] for r in b] == STEPS
    for ra, rb in zip(a, b):
        assert ra['tokens'] == rb['tokens'] == ra['step'] * 8 * 16  # tokens count every process
        assert ra['lr'] == rb['lr']
        for key in ('loss.train', 'loss.valid'):  # mean over both processes' batches / validation shards
            assert (key in ra) == (key in rb)
            if key in ra:
                assert rb[key] == pytest.approx(ra[key], rel=1e-4), (ra['step'], key)
        assert rb.get('accuracy.valid') == pytest.approx(ra.get('accuracy.valid'), abs=1.5 / (8 * 16))
    pa, pb = load_checkpoint(one / 'checkpoint.pt'), load_checkpoint(two / 'checkpoint.pt')
    assert pb['world_size'] == 2 and pa['position']['tokens'] == pb['position']['tokens']
    for k, v in pa['model'].items():
        if k.endswith('self_attn.key.linear.bias'):
            # q·b_k is the same for every key, and softmax ignores a shift, so this bias's exact gradient is 0:
            # both runs get rounding noise there, which Adam scales up to full-size (different) steps
            continue
        torch.testing.assert_close(pb['model'][k], v, rtol=1e-4, atol=1e-5, msg=lambda m, k=k: f'{k}: {m}')
    # what the job printed came from rank 0 only: one sample per validation, one summary
    assert log.count('sample: ') == 5 and log.count('done: step 30') == 1, log
    assert '2 processes' in log and 'effective batch 8' in log, log


def _rank_of(pid: int) -> Optional[int]:
    try:
        env = Path(f'/proc/{pid}/environ').read_bytes().split(b'\0')
    except OSError:
        return None
    for item in env:
        if item.startswith(b'RANK='):
            return int(item[5:])
    return None


def test_killing_one_rank_ends_the_job_and_the_run_resumes_exactly(single_and_ddp, tmp_path):
    from lazylab.experiments.trainer import load_checkpoint, read_metrics
    _, reference, _ = single_and_ddp
    runs = tmp_path / 'runs'
    job = Job(TORCHRUN + ['-m', 'lazylab.experiments.transformer', *E2E, 'batch_size=4', f'runs_dir={runs}'],
              cwd=tmp_path, env={'LAZYLAB_DIST_TIMEOUT': '300'})
    try:
        killed_at = _signal_rank1_after(job, runs, 9, signal.SIGKILL)  # a checkpoint exists (step 6)
        assert killed_at is not None and killed_at < 30, job.output()
        rc = job.wait(within=60)  # torchrun stops rank 0 at once; 60 s only guards against a hang
        log = job.output()
    finally:
        job.close()
    assert rc != 0 and 'Signal 9 (SIGKILL) received by PID' in log, log
    run_dir = _run_dir(runs)
    assert load_checkpoint(run_dir / 'checkpoint.pt')['position']['step'] < 30

    run(TORCHRUN + ['-m', 'lazylab.cli', 'resume', str(run_dir)], cwd=tmp_path)
    assert [r['step'] for r in read_metrics(run_dir / 'metrics.jsonl')] == STEPS
    _assert_resumed_exactly(run_dir, reference)


def _signal_rank1_after(job: 'Job', runs: Path, step: int, signum: int) -> Optional[int]:
    """Once the job's metrics.jsonl has a record of `step` or later, send `signum` to its rank-1 process only;
    returns the last step recorded then (None: the job ended first, or 180 s passed)."""
    from lazylab.experiments.trainer import read_metrics
    rank1 = next(pid for pid in job.find_workers(2) if _rank_of(pid) == 1)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and job.proc.poll() is None:
        metrics = list(runs.glob('transformer/*/metrics.jsonl'))
        steps = [r['step'] for r in read_metrics(metrics[0])] if metrics else []
        if steps and steps[-1] >= step:
            os.kill(rank1, signum)
            return steps[-1]
        time.sleep(0.01)
    return None


def _assert_resumed_exactly(run_dir: Path, reference: Path) -> None:
    """The resumed run's records and parameters are bitwise the reference's."""
    from lazylab.experiments.trainer import load_checkpoint, read_metrics
    got, want = read_metrics(run_dir / 'metrics.jsonl'), read_metrics(reference / 'metrics.jsonl')
    assert [r['step'] for r in got] == [r['step'] for r in want]
    for g, w in zip(got, want):
        for key in ('loss.train', 'accuracy.train', 'loss.valid', 'accuracy.valid', 'lr', 'tokens'):
            assert g.get(key) == w.get(key), (g['step'], key)  # bitwise
    ours, theirs = load_checkpoint(run_dir / 'checkpoint.pt'), load_checkpoint(reference / 'checkpoint.pt')
    for k, v in theirs['model'].items():
        assert torch.equal(ours['model'][k], v), k


#: 120 steps, validated every 50: a stop lands between validations; a record every 3 steps shows the progress
LONG = [*(a for a in E2E if not a.startswith(('max_steps=', 'valid_interval='))), 'max_steps=120',
        'valid_interval=50', 'batch_size=4']


@pytest.fixture(scope='module')
def ddp_reference(tmp_path_factory):
    """A two-process run of LONG that nobody stops."""
    base = tmp_path_factory.mktemp('ddp-long')
    run(TORCHRUN + ['-m', 'lazylab.experiments.transformer', *LONG, f'runs_dir={base}'], cwd=base)
    return _run_dir(base)


def test_a_stop_signal_to_one_process_stops_all_after_the_same_step_and_resumes_exactly(ddp_reference, tmp_path):
    """SIGUSR1 (a cluster's preemption warning) reaches rank 1 only: the processes agree on the step to stop after
    (the step's all-reduce carries the signal), rank 0 writes that step's checkpoint and run.json, and a resume under
    torchrun ends equal, bit for bit, to the run that never stopped."""
    from lazylab.experiments.trainer import load_checkpoint
    runs = tmp_path / 'runs'
    job = Job(TORCHRUN + ['-m', 'lazylab.experiments.transformer', *LONG, f'runs_dir={runs}'], cwd=tmp_path,
              env={'LAZYLAB_DIST_TIMEOUT': '300'})
    try:
        assert _signal_rank1_after(job, runs, 9, signal.SIGUSR1) is not None, job.output()
        rc = job.wait(within=120)
        log = job.output()
    finally:
        job.close()
    run_dir = _run_dir(runs)
    info = json.loads((run_dir / 'run.json').read_text())
    assert rc != 0 and (info['status'], info['signal']) == ('preempted', 'SIGUSR1'), log
    saved = load_checkpoint(run_dir / 'checkpoint.pt')
    assert info['steps'] == info['checkpoint_step'] == saved['position']['step'] < 120, log
    assert saved['world_size'] == 2 and len(saved['rng_per_rank']) == 2
    assert f'lazylab: preempted (SIGUSR1) at step {info["steps"]}; lazylab resume' in log, log

    run(TORCHRUN + ['-m', 'lazylab.cli', 'resume', str(run_dir)], cwd=tmp_path)
    _assert_resumed_exactly(run_dir, ddp_reference)


if __name__ == '__main__':
    _worker_main(sys.argv[1], sys.argv[2])
