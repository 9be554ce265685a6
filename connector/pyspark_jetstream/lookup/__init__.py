"""Lookup joins (issue #55): a DataFrame's rows joined with a KV bucket's value of each row's key, at the cost
of the rows, not of the bucket.

* :mod:`.spark`: ``lookup()``, what the user calls (checked when the DataFrame is defined);
* :mod:`.task`: what ``mapInArrow`` runs on an executor, per Arrow batch;
* :mod:`.join`: the keys of a batch and the join, column-wise (pure);
* :mod:`.fetch`: the entries of a batch's keys, by batched direct gets;
* :mod:`.cache` (``cache=partial``) and :mod:`.full_cache` (``cache=full``): a worker's caches.
"""

from .spark import lookup

__all__ = ["lookup"]
