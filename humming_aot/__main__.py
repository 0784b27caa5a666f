"""`python -m humming_aot` is the `humming-aot` command."""
import sys

from humming_aot.cli import main

sys.exit(main())
