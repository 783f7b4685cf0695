"""lazylab: lazy experiment configurations and research transformers on PyTorch.

Importing the package imports nothing heavy; `lazylab.configs` in particular never imports torch.
"""
__version__ = '0.1.0'
