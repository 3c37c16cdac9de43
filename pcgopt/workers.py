"""Independent jobs spread over worker processes, results in the order they finish.

Workers start from a fork server, not by forking the caller: the caller may have started z3's
threads, and a forked copy of a threaded process can hang. So ``fn`` must be a function of an
importable module (not of a script run as ``__main__``), and jobs and results must pickle.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterable, Iterator


def imap_unordered[J, R](fn: Callable[[J], R], jobs: Iterable[J], workers: int) -> Iterator[R]:
    """``fn`` over ``jobs``; in this process when ``workers`` is 1 or there is one job."""
    jobs = list(jobs)
    if workers <= 1 or len(jobs) <= 1:
        for job in jobs:
            yield fn(job)
        return
    with multiprocessing.get_context("forkserver").Pool(min(workers, len(jobs))) as pool:
        yield from pool.imap_unordered(fn, jobs, chunksize=1)
