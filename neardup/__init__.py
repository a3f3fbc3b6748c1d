"""neardup: near-duplicate detection for Chinese web pages."""

import os

# numpy's OpenBLAS starts a thread per core at import, which spins between calls. The
# engine's matrix products are a few hundred by 64 and gain nothing from it: over the
# 2,744 dev pages that thread used 0.09 s of CPU in `neardup dedup`'s own process, which
# makes no matrix product at all (the sandbox's processes already run with one thread).
# Set before anything imports numpy; a value the user set is kept.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

__version__ = "0.1.0"
