"""The byte format of a partition's state: grouping and user keys (:mod:`.codec`), schema-driven values
(:mod:`.values`), the column families they live in (:mod:`.layout`) and the errors a value that does not
fit its declaration raises (:mod:`.errors`).

The processor API writes this format; the state reader, adjunct stores and ``blobstate verify`` read it.
It depends on nothing else of blobstate but :mod:`blobstate.errors`, so every one of them can import it.
"""
