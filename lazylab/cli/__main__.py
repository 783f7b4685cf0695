"""`python -m lazylab.cli COMMAND …` (what torchrun runs: `torchrun … -m lazylab.cli train EXPERIMENT …`)."""
import sys

from lazylab.cli import main

if __name__ == '__main__':
    sys.exit(main())
