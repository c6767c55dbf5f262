"""The wire: what crosses between processes (trainers, driver, scheduler, workers).

``frames`` is the Dask serializer for batches and chunks (numpy frames, no pickle); ``messages``
names every mdata handler and types each request and reply (built from ``codec``, ``jobs``,
``inspection``, ``delivery`` and ``construct``); ``errors`` carries :class:`~mdata.errors.MdataError`
subclasses across processes with their fields. Both sides import these modules, so they depend
only on the pure core and on Dask's protocol layer.

Where this runs and how a step flows through it: docs/dev/architecture.md.
"""
