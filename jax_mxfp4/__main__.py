"""``python -m jax_mxfp4``: the command line (``jax_mxfp4.cli``)."""

import sys

from jax_mxfp4.cli import main

if __name__ == "__main__":
    sys.exit(main())
