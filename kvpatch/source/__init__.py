"""Where vLLM's source comes from and where kvpatch writes: the I/O edge of the pipeline.

* :mod:`.releases`: which releases carry the header, and its revisions;
* :mod:`.fetch`: a release's tree, fetched by git or from the package index, cached;
* :mod:`.workspace`: the tree being patched, the local-edit check, the state of the last apply.
"""
