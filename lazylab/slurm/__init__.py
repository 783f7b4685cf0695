"""Runs and sweep trials as Slurm jobs, through submitit (the `slurm` extra): `--slurm KEY=VALUE,…`.

    lazylab train transformer d_model=256 --slurm partition=gpu,time=4:00:00,gpus_per_node=1 [--wait]
    lazylab resume runs/transformer/RUN_ID --slurm partition=gpu,time=4:00:00
    lazylab sweep transformer d_model=128,256 --launcher slurm --slurm partition=gpu,time=60 --workers 2

The parts, below the sweeps and above the experiments (docs/guide/slurm.md is the user's guide):

    options     `--slurm` → `SlurmOptions` (submitit's parameters, every other sbatch option, the warning signal)
    cluster     Slurm's answers: job states (squeue), `sbatch --test-only`, requeue, cancel (torch-free)
    executor    submitit's SlurmExecutor with lazylab's job script (the warning signal passed on to every process)
    job         what runs in the job: train or resume the run directory; at the warning signal, checkpoint,
                record the requeue in run.json, `scontrol requeue`, exit; at scancel, record `cancelled`
    jobs        what `lazylab train/resume --slurm` do on the login node: check, submit, print, follow (`--wait`)

This package imports no torch (`job` and `jobs` do, and are imported by name where they are used); submitit is
imported only once an executor is made or the options are read.
"""
from lazylab.slurm.cluster import JobState, job_state, job_states
from lazylab.slurm.executor import SLURM_DIR, make_executor
from lazylab.slurm.options import SlurmOptions, parse_options

__all__ = ['SLURM_DIR', 'JobState', 'SlurmOptions', 'job_state', 'job_states', 'make_executor', 'parse_options']
