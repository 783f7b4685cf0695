"""`python -m lazylab.dashboard` ≡ `lazylab dashboard`."""
import sys

from lazylab.dashboard.server import main

sys.exit(main())
