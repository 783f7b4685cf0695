"""`python -m lazylab COMMAND …` ≡ `lazylab COMMAND …`."""
import sys

from lazylab.cli import main

if __name__ == '__main__':
    sys.exit(main())
