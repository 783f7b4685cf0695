"""`--slurm KEY=VALUE,…`: what it becomes (submitit's parameters, sbatch's other options, the warning signal, the
job script), and the mistakes that are one `lazylab: error:` line, exit 2, before anything is written or submitted."""
import pytest

from lazylab.errors import UsageError
from lazylab.slurm import cluster
from lazylab.slurm.options import parse_options, parse_signal, split_options

submitit = pytest.importorskip('submitit')  # the `slurm` extra (make install has it)


def test_commas_separate_options_only_before_a_key():
    assert split_options('partition=gpu,mail_type=BEGIN,END,nodelist=n[1-3],n5') == \
        ['partition=gpu', 'mail_type=BEGIN,END', 'nodelist=n[1-3],n5']
    options = parse_options(['partition=gpu,cpus-per-task=4,time=1-12:00:00', 'mail_type=BEGIN,END,exclusive=true',
                             'reservation=x,gpus=2,signal=USR2@300'])
    assert options.parameters == {'partition': 'gpu', 'cpus_per_task': 4, 'time': '1-12:00:00',
                                  'mail_type': 'BEGIN,END', 'exclusive': True}
    assert options.additional == {'reservation': 'x', 'gpus': '2'}
    assert (options.signal, options.warning_s, options.sbatch_signal) == ('USR2', 300, 'B:USR2@300')


def test_the_tasks_are_nodes_times_tasks_per_node():
    options = parse_options(['nodes=3,tasks_per_node=4,cpus_per_task=2'])
    assert (options.tasks, options.cpus_per_task) == (12, 2)
    assert parse_options([]).tasks == 1 and parse_options([]).signal == 'USR1'


@pytest.mark.parametrize('text, expected', [('USR1', ('USR1', 90)), ('SIGUSR2@120', ('USR2', 120)),
                                            ('B:USR1@30', ('USR1', 30)), ('hup@0', ('HUP', 0))])
def test_the_warning_signal_is_a_name_and_seconds(text, expected):
    assert parse_signal(text) == expected


@pytest.mark.parametrize('option, message', [
    ('partiton=gpu', "did you mean 'partition'"),
    ('nodes=0', 'nodes=0: expected a whole number ≥ 1'),
    ('cpus_per_task=two', 'expected a whole number'),
    ('time=1h', 'Slurm reads minutes'),
    ('signal=TERM@30', 'SIGTERM cannot be the warning signal'),
    ('signal=NOPE', "unknown signal 'NOPE'"),
    ('signal=USR1@1e9', 'whole number in [0, 65535]'),
    ('output=x.log', 'lazylab sets it (the job writes RUN_DIR/output.log)'),
    ('ntasks=4', 'give nodes= and ntasks_per_node='),
    ('partition', 'write KEY=VALUE'),
    ('partition=', 'partition needs a value'),
    ('nodes=1,nodes=2', 'nodes is given twice'),
])
def test_a_bad_option_is_one_line_before_anything_is_written(option, message, cli_error, tmp_path):
    error = cli_error(['train', 'transformer', f'runs_dir={tmp_path}', '--slurm', option])
    assert message in error and '--slurm' in error
    assert list(tmp_path.iterdir()) == []


def test_wait_and_slurm_go_together(cli_error, tmp_path):
    assert cli_error(['train', 'transformer', f'runs_dir={tmp_path}', '--wait']) == \
        '--wait goes with --slurm (a run here is followed anyway)'
    assert cli_error(['sweep', 'transformer', 'd_model=16,24', '--slurm', 'time=5', '--dry-run']) == \
        '--slurm goes with --launcher slurm (each trial a Slurm job)'


def test_the_job_script_passes_the_signal_on_and_keeps_submitits_surprises_out(tmp_path):
    from lazylab.slurm.executor import make_executor, script_text
    options = parse_options(['partition=gpu,nodes=2,ntasks_per_node=4,signal=USR2@120,licenses=a:1'])
    text = script_text(make_executor(tmp_path / 'slurm', options, job_name='lazylab-x', log=tmp_path / 'output.log'))
    for line in ('#SBATCH --signal=B:USR2@120', '#SBATCH --partition=gpu', '#SBATCH --nodes=2',
                 '#SBATCH --ntasks-per-node=4', '#SBATCH --licenses=a:1', f'#SBATCH --output={tmp_path}/output.log',
                 '#SBATCH --open-mode=append', '#SBATCH --job-name=lazylab-x', 'export LAZYLAB_STOP_SIGNAL=USR2',
                 'export SUBMITIT_PREEMPT_SIGNAL=USR2', 'trap lazylab_forward USR2'):
        assert line in text.splitlines(), (line, text)
    assert '-ge 8 ]' in text  # the signal waits for the 2 × 4 processes to be ready
    assert '--time' not in text and 'wckey' not in text and '#SBATCH --error' not in text
    srun = next(x for x in text.splitlines() if x.startswith('srun '))
    assert srun.endswith(' &') and '--kill-on-bad-exit=1' in srun and '--unbuffered' not in srun
    assert text.index('trap lazylab_forward') < text.index('\nsrun ')


def test_slurm_durations_and_wait_statuses_read_as_slurm_writes_them():
    assert [cluster.seconds(t) for t in ('00:01:30', '1-00:00:00', '5', '02:03', 'UNLIMITED')] == \
        [90, 86400, 300, 123, None]
    assert [cluster.wait_status(raw) for raw in (0, 768, 138 << 8, 15, 9)] == [0, 3, 138, 143, 137]
    state = cluster.JobState('7', 'PENDING', 'BeginTime', restarts=1)
    assert (state.state, state.ended, state.known) == ('pending', False, True)
    assert cluster.JobState('7', 'CANCELLED').state == 'cancelled'
    assert cluster.JobState('7', 'UNKNOWN').state == 'unknown'


def test_slurm_refusing_the_options_is_one_line_and_nothing_is_submitted(slurm, cli_error, tmp_path):
    for option, message in (('foo=1', "unrecognized option '--foo=1'"),
                            ('partition=nope', 'invalid partition'),
                            ('nodes=5', 'Requested node configuration is not available')):
        error = cli_error(['train', 'transformer', f'runs_dir={tmp_path}', '--slurm', option])
        assert error.startswith('--slurm: Slurm refuses the job: ') and message in error, error
    assert list(tmp_path.iterdir()) == [] and slurm.jobs() == {}


def test_a_bad_setting_is_one_line_before_the_job_is_submitted(slurm, cli_error, tmp_path):
    assert "d_modle" in cli_error(['train', 'transformer', 'd_modle=16', f'runs_dir={tmp_path}', '--slurm', 'time=5'])
    assert list(tmp_path.iterdir()) == [] and slurm.jobs() == {}


def test_resume_of_a_finished_run_submits_nothing_and_one_without_a_checkpoint_is_refused(slurm, short_run, tmp_path,
                                                                                        cli_error, capsys):
    import shutil

    from lazylab import cli
    run = tmp_path / 'run'
    shutil.copytree(short_run, run)
    assert cli.main(['resume', str(run), '--slurm', 'time=5']) == 0
    assert capsys.readouterr().out.startswith('nothing to do: ')
    (run / 'checkpoint.pt').unlink()
    (run / 'run.json').write_text((run / 'run.json').read_text().replace('"completed"', '"killed"'))
    assert 'has no checkpoint to resume from' in cli_error(['resume', str(run), '--slurm', 'time=5'])
    assert slurm.jobs() == {}


def test_without_slurms_commands_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setenv('PATH', '/nonexistent')
    with pytest.raises(UsageError, match='apt-get install slurm-client'):
        cluster.job_states(['1'])
