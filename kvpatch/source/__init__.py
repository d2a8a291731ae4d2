"""Where vLLM's source comes from and where kvpatch writes: the I/O edge of the pipeline.

* :mod:`.releases`: which releases carry the header, and its revisions;
* :mod:`.cache`: where the cache is, and kvpatch's folders in it;
* :mod:`.fetch`: a release's tree, fetched by git or from the package index, cached;
* :mod:`.repo` (through :mod:`.git`): kvpatch's own repositories of a release;
* :mod:`.tree`: the tree being patched and the local-edit check; :mod:`.state`: the record of
  the last apply; :mod:`.workspace`: locks, writing the header and the state, the checkout.
"""
