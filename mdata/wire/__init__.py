"""The wire: what crosses between processes (trainers, driver, scheduler, workers).

``frames`` is the Dask serializer for batches and chunks (numpy frames, no pickle); ``messages``
names every mdata handler and types each request and reply. Both sides import these modules, so
they depend only on the pure core and on Dask's protocol layer.
"""
