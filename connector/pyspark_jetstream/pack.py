"""``python -m pyspark_jetstream.pack OUT.zip``, as the README documents it.

It lives in :mod:`pyspark_jetstream.tools.pack`.
"""

import sys

from .tools.pack import main, pack

__all__ = ["main", "pack"]

if __name__ == "__main__":
    sys.exit(main())
