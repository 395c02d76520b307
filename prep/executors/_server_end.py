"""Imported by prep's forkserver alone (``_spawn.PRELOAD``): it ends at once when its
parent has gone, without finalizing the torch it preloaded.

The server holds the caller's stdout and stderr (its workers write there). Left
to a normal exit it spends half a second or more finalizing torch after the
caller exited, and a program reading the caller's output through a pipe waits
for that long. It has nothing to flush or release: the workers it forked are the
caller's pools', which close themselves, and it writes nothing. Its children
exit with ``os._exit`` as every multiprocessing child does, so this handler,
which they inherit, never runs in them.
"""

from __future__ import annotations

import atexit
import os

atexit.register(os._exit, 0)
