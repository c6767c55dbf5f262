"""mdata's pages on the Dask dashboard, one small module per panel.

Each panel module holds a component class (a ``source``: Bokeh ColumnDataSource, a ``root``: the
Bokeh layout, an ``update()`` that refreshes the source from the Planner) and the page function
that puts it on a Bokeh document, as distributed's own dashboard components do. The figures each
panel draws come from :mod:`scheduler_plugins.dashboard.figures`, which the JSON routes
(:mod:`scheduler_plugins.dashboard.routes`) serve too, so a page and its route never disagree.
:mod:`scheduler_plugins.dashboard.pages` holds the route table and registers it with the
scheduler's dashboard; ``scheduler_plugins.planner`` does that when it is imported as a preload.
"""
