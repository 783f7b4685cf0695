"""`--slurm KEY=VALUE[,KEY=VALUE…]`: the sbatch options of a run or a sweep's trials, checked before anything is
submitted (torch-free; submitit is imported only to read its parameter names).

    parse_options(['partition=gpu,time=4:00:00,gpus_per_node=1', 'mail_type=BEGIN,END'])

Every sbatch option can be given. submitit's own Slurm parameters (`partition`, `time`, `nodes`,
`ntasks_per_node`, `cpus_per_task`, `gpus_per_node`, `mem`, `account`, `qos`, `constraint`, `exclude`, `gres`,
`nodelist`, `dependency`, `exclusive`, `comment`, `mail_type`, …) are typed here; any other key is an sbatch long
option passed through submitit's `slurm_additional_parameters` (`gpus=2`, `reservation=x`, `licenses=…`), checked
by Slurm itself (`sbatch --test-only`, lazylab.slurm.cluster) before the job is submitted. A key may be written with
`-` or `_` (`cpus-per-task`, `cpus_per_task`). The commas between options separate them only where a `KEY=` follows,
so a value may hold commas (`mail_type=BEGIN,END`); an option that takes no value is `KEY=true` (`exclusive=true`).
`--slurm` may be given several times.

`signal=NAME[@SECONDS]` (default `USR1@90`) is the warning signal: sbatch's `--signal=B:NAME@SECONDS`, sent to the
job's batch shell, which passes it on to the run's processes (lazylab.slurm.executor); the run checkpoints at it and
requeues itself (lazylab.slurm.job). A signal other than USR1 travels to the run as `LAZYLAB_STOP_SIGNAL`.
"""
import difflib
import re
import signal as signal_module
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lazylab.errors import UsageError

#: the warning signal and how many seconds before the time limit Slurm sends it (`signal=USR1@90`)
DEFAULT_SIGNAL, DEFAULT_WARNING_S = 'USR1', 90

#: submitit parameters lazylab sets itself (the job's log, its command line, its signal), with the reason
RESERVED = {
    'output': 'the job writes RUN_DIR/output.log', 'error': 'the job writes RUN_DIR/output.log',
    'open_mode': 'the log is appended to (a requeued job adds to it)', 'array': 'a sweep submits one job per trial',
    'wrap': 'lazylab writes the job script', 'parsable': 'lazylab reads the job id', 'test_only': 'lazylab runs it',
    'setup': 'lazylab writes the job script', 'teardown': 'lazylab writes the job script',
    'srun_args': 'lazylab writes the srun line', 'use_srun': 'the job runs its processes through srun',
    'python': 'the job runs this Python', 'folder': 'it is RUN_DIR/slurm', 'command': 'lazylab writes it',
    'map_count': 'a sweep submits one job per trial', 'array_parallelism': 'the sweep\'s --workers says it',
    'signal_delay_s': 'give signal=NAME@SECONDS', 'stderr_to_stdout': 'the job writes RUN_DIR/output.log',
    'additional_parameters': 'give the options themselves', 'num_gpus': 'give gpus_per_node',
    'ntasks': 'give nodes= and ntasks_per_node= (every node runs as many processes)',
}
#: submitit parameters that are counts
INTEGERS = ('nodes', 'ntasks_per_node', 'cpus_per_task', 'cpus_per_gpu', 'gpus_per_node', 'gpus_per_task')
#: another name users write for a submitit parameter
ALIASES = {'tasks_per_node': 'ntasks_per_node', 'name': 'job_name', 'timeout_min': 'time'}
#: signals that cannot be the warning: uncatchable, Slurm's own stop (TERM, after CONT), Ctrl-C, a child's end
NOT_WARNINGS = ('KILL', 'STOP', 'TERM', 'CONT', 'INT', 'CHLD')
_TIME = re.compile(r'\d+(:\d{1,2}){0,2}|\d+-\d+(:\d{1,2}){0,2}')  # sbatch --time: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
_KEY = re.compile(r'[A-Za-z][A-Za-z0-9_-]*')


def submitit_parameters() -> dict[str, Any]:
    """submitit's Slurm parameters and their defaults (`SlurmExecutor.update_parameters` takes these).

    Raises:
        UsageError: submitit is not installed (the `slurm` extra).
    """
    try:
        from submitit.slurm import slurm  # an optional dependency (the `slurm` extra): only --slurm needs it
    except ImportError:
        raise UsageError("--slurm needs submitit: pip install 'lazylab[slurm]'") from None
    return slurm._get_default_parameters()


@dataclass
class SlurmOptions:
    """A checked `--slurm` (see the module docstring).

    Args:
        parameters: submitit `SlurmExecutor` parameters (typed), as given.
        additional: the other sbatch options ({key with `_`: value}), submitit's `slurm_additional_parameters`.
        signal: the warning signal's name without SIG ('USR1').
        warning_s: the seconds before the time limit Slurm sends it.
        given: the options as written (for records and messages).
    """
    parameters: dict[str, Any] = field(default_factory=dict)
    additional: dict[str, Any] = field(default_factory=dict)
    signal: str = DEFAULT_SIGNAL
    warning_s: int = DEFAULT_WARNING_S
    given: list[str] = field(default_factory=list)

    @property
    def nodes(self) -> int:
        """The job's nodes (`nodes=`, 1 by default)."""
        return int(self.parameters.get('nodes', 1))

    @property
    def tasks(self) -> int:
        """The run's processes: nodes × ntasks_per_node (each a rank of a data-parallel run when more than one)."""
        return self.nodes * int(self.parameters.get('ntasks_per_node') or 1)

    @property
    def cpus_per_task(self) -> int:
        """The cores each process gets (`cpus_per_task=`, 1 by default): a trial's torch threads."""
        return int(self.parameters.get('cpus_per_task') or 1)

    @property
    def sbatch_signal(self) -> str:
        """sbatch's --signal: to the batch shell (B:), which passes it on to the processes."""
        return f'B:{self.signal}@{self.warning_s}'

    def shown(self) -> str:
        """The options as one `--slurm` value (for messages and records)."""
        return ','.join(self.given)


def split_options(text: str) -> list[str]:
    """`KEY=VALUE,KEY=VALUE…` cut at the commas that a `KEY=` follows (a value may hold commas)."""
    return [t for t in re.split(r',(?=\s*[A-Za-z][A-Za-z0-9_-]*=)', text) if t.strip()]


def parse_options(texts: Sequence[str]) -> SlurmOptions:
    """The checked options of one or several `--slurm` values.

    Args:
        texts: the values of each `--slurm` flag (`KEY=VALUE[,KEY=VALUE…]`).

    Raises:
        UsageError: submitit missing; a token that is not KEY=VALUE, a key given twice or reserved, a count that
            is not a positive integer, a `time` Slurm cannot read, an unknown warning signal (one line each, naming
            the option).
    """
    known = submitit_parameters()
    options = SlurmOptions()
    seen: set[str] = set()
    for token in (t.strip() for text in texts for t in split_options(text)):
        key, eq, value = token.partition('=')
        key, value = key.strip(), value.strip()
        if not eq or not _KEY.fullmatch(key):
            raise UsageError(f'--slurm {token!r}: write KEY=VALUE (e.g. partition=gpu,time=60; a flag: exclusive=true)')
        name = key.replace('-', '_')
        name = ALIASES.get(name, name)
        if name in seen:
            raise UsageError(f'--slurm: {key} is given twice')
        seen.add(name)
        if not value:
            raise UsageError(f'--slurm {token!r}: {key} needs a value (a flag: {key}=true)')
        options.given.append(f'{key}={value}')
        if name == 'signal':
            options.signal, options.warning_s = parse_signal(value)
        elif name in RESERVED:
            raise UsageError(f'--slurm {key}: lazylab sets it ({RESERVED[name]})')
        elif name in known:
            options.parameters[name] = _typed(name, value)
        else:
            _check_sbatch_key(key, known)
            options.additional[name] = True if value.lower() == 'true' else value
    return options


def _typed(name: str, value: str) -> Any:
    """A submitit parameter's value from its text: counts as int, `time` checked, a flag as True."""
    if name in INTEGERS:
        if not value.isdigit() or int(value) < (0 if name.startswith('gpus') else 1):
            raise UsageError(f'--slurm {name}={value}: expected a whole number ≥ {0 if name.startswith("gpus") else 1}')
        return int(value)
    if name == 'time' and not _TIME.fullmatch(value):
        raise UsageError(f'--slurm time={value}: Slurm reads minutes, M:S, H:M:S, D-H, D-H:M or D-H:M:S '
                         f'(e.g. time=90 or time=1-12:00:00)')
    if value.lower() == 'true':
        return True
    return value


def _check_sbatch_key(key: str, known: dict[str, Any]) -> None:
    """A key that is not submitit's: an sbatch long option is passed on, checked by `sbatch --test-only`; a near
    miss of a submitit parameter is named."""
    close = difflib.get_close_matches(key.replace('-', '_'), list(known) + ['signal'], n=1, cutoff=0.8)
    if close and close[0] != key.replace('-', '_'):
        raise UsageError(f"--slurm {key}: did you mean '{close[0]}'? (other keys are sbatch's long options, "
                         f'passed on as --{key.replace("_", "-")})')


def parse_signal(text: str) -> tuple[str, int]:
    """(name without SIG, seconds) of `signal=[B:][SIG]NAME[@SECONDS]` (seconds: 90 when not given).

    Args:
        text: the value of `signal=`.

    Raises:
        UsageError: a name Python does not know, one that cannot be the warning (KILL, STOP, TERM, CONT, INT,
            CHLD), seconds that are not a whole number in [0, 65535].
    """
    body = text[2:] if text.upper().startswith('B:') else text
    name, _, seconds = body.partition('@')
    name = name.strip().upper()
    name = name[3:] if name.startswith('SIG') else name
    if not hasattr(signal_module, 'SIG' + name) or name.startswith(('SIG_', 'CTRL')):
        raise UsageError(f'--slurm signal={text}: unknown signal {name!r} (e.g. signal=USR1@90, signal=USR2@300)')
    if name in NOT_WARNINGS:
        raise UsageError(f'--slurm signal={text}: SIG{name} cannot be the warning signal (SIGTERM and SIGKILL are how '
                         f'Slurm ends a job); use USR1 or USR2')
    if seconds and (not seconds.strip().isdigit() or int(seconds) > 65535):
        raise UsageError(f'--slurm signal={text}: the seconds before the time limit must be a whole number in '
                         f'[0, 65535]')
    return name, int(seconds) if seconds else DEFAULT_WARNING_S
