"""`lazylab resume RUN_DIR [--allow-changes] [--slurm KEY=VALUE,… [--wait]]`: continue a run from its checkpoint,
exactly where it stopped, here or as a Slurm job."""
from lazylab.cli.train import add_slurm_flags, slurm_options
from lazylab.command_line import Parser


def parser() -> Parser:
    p = Parser('resume', description='Continue the run in RUN_DIR from its checkpoint, exactly where it stopped (its '
                                     'configs.yaml, the same text and number of processes; its experiment imported '
                                     'again from where run.json says it came from).')
    p.add_argument('run_dir', metavar='RUN_DIR')
    p.add_argument('--allow-changes', action='store_true',
                   help='go on although a computed value now comes out differently')
    add_slurm_flags(p, 'the resume')
    return p


def run(argv: list[str]) -> int:
    a = parser().parse(argv)
    options = slurm_options(a)
    if options is not None:
        from lazylab.slurm.jobs import submit_resume  # submitit and Slurm's commands: only for --slurm
        return submit_resume(a.run_dir, options=options, allow_changes=a.allow_changes, wait=a.wait)
    from lazylab.experiments.lifecycle import resume_main  # torch: only when a run resumes
    resume_main(a.run_dir, allow_changes=a.allow_changes)
    return 0
