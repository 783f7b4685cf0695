"""`lazylab resume RUN_DIR [--allow-changes]`: continue a run from its checkpoint, exactly where it stopped."""
from lazylab.command_line import Parser


def parser() -> Parser:
    p = Parser('resume', description='Continue the run in RUN_DIR from its checkpoint, exactly where it stopped (its '
                                     'configs.yaml, the same text and number of processes; its experiment imported '
                                     'again from where run.json says it came from).')
    p.add_argument('run_dir', metavar='RUN_DIR')
    p.add_argument('--allow-changes', action='store_true',
                   help='go on although a computed value now comes out differently')
    return p


def run(argv: list[str]) -> None:
    a = parser().parse(argv)
    from lazylab.experiments.lifecycle import resume_main  # torch: only when a run resumes
    resume_main(a.run_dir, allow_changes=a.allow_changes)
