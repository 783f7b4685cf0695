"""lazylab: lazy experiment configs, feedback and fast-weights transformers, and a CPU-friendly trainer."""
from setuptools import find_packages, setup

setup(
    name='lazylab',
    version='0.1.0',
    description='Lazy experiment configs and research transformers (feedback, fast weights) on PyTorch',
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    python_requires='>=3.9',
    packages=find_packages(include=['lazylab', 'lazylab.*']),
    package_data={'lazylab.data': ['tiny_shakespeare.txt']},
    install_requires=[
        'torch>=2.1',        # the models, kernels and training loop
        'labml>=0.5.3',      # experiment tracking: screen/file writers and the labml dashboard
        'PyYAML>=6.0',       # configs.yaml dumps and --config files (safe_load only)
        'annotated-types>=0.6',  # range constraints of typed config items (Annotated[int, Ge(1)])
        'numpy>=1.22',       # labml's indicator storage; metrics helpers
        'matplotlib>=3.5',   # `lazylab plot` and the notebooks' live loss plot
    ],
    extras_require={
        'test': [
            'pytest>=7',           # the test runner
            'pytest-timeout>=2',   # bounds tests that start processes (resume, torchrun)
            'hypothesis>=6',       # property tests of the config engine and kernels
            'einops>=0.6',         # needed by the labml_nn reference (installed with --no-deps)
            'nbclient>=0.7',       # executes the notebooks in the tests
            'nbformat>=5',         # reads/writes the notebooks
            'ipykernel>=6',        # the kernel nbclient runs the notebooks in
        ],
        'dashboard': [
            'labml-app==0.5.14',   # labml's dashboard server, run by `lazylab dashboard` over a file store
            'labml-db==0.0.15',    # its storage layer; lazylab installs its file drivers (no MongoDB needed)
        ],
    },
    entry_points={'console_scripts': ['lazylab=lazylab.cli:main']},
)
