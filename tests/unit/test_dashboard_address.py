"""A dashboard address without a host binds where the scheduler binds (Dask alone would bind it to
every interface)."""

from mdata.driver.cluster import dashboard_on_host


def test_a_dashboard_address_without_a_host_takes_the_schedulers():
    assert dashboard_on_host(":8787", "127.0.0.1") == "127.0.0.1:8787"
    assert dashboard_on_host(":0", "10.1.2.3") == "10.1.2.3:0"
    assert dashboard_on_host(8787, "127.0.0.1") == "127.0.0.1:8787"
    assert dashboard_on_host(":8787,:8788", "127.0.0.1") == "127.0.0.1:8787,127.0.0.1:8788"


def test_an_address_with_a_host_or_none_is_kept():
    assert dashboard_on_host("0.0.0.0:8787", "127.0.0.1") == "0.0.0.0:8787"
    assert dashboard_on_host("localhost:0", "127.0.0.1") == "localhost:0"
    assert dashboard_on_host(None, "127.0.0.1") is None
