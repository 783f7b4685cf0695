"""labml_nn 0.5.1's ``transformers.glu_variants.simple`` at a tiny size, for the corpus test
(test_labml_nn_corpus.py): the module has no config class (its sizes are the defaults of a dataclass its ``main()``
builds), so no ``key=value`` reaches them; this file gives the dataclass tiny defaults and runs the module's own
``main()``, ``Trainer`` and dataset unchanged.

    lazylab labml tests/labml/glu_simple_tiny.py --steps 2
"""
import dataclasses

from labml_nn.transformers.glu_variants import simple


@dataclasses.dataclass
class TinyConfigs(simple.Configs):
    d_model: int = 16
    seq_len: int = 16
    batch_size: int = 2
    n_layers: int = 1
    n_heads: int = 2
    d_ff: int = 32


simple.Configs = TinyConfigs  # main() builds `Configs()` from the module's globals
main = simple.main

if __name__ == '__main__':
    main()
