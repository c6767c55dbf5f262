from mdata.pool_scaling import PoolScale, pool_targets


def test_a_pool_needs_the_sum_of_its_sources_within_bounds():
    targets = {
        "chat": {"workers": 1, "reason": "chat needs 0.4 cores"},
        "code": {"workers": 2, "reason": "code needs 1.6 cores"},
        "captions": {"workers": 5, "reason": "captions needs 4.9 cores"},
    }
    pools = {"text": ("chat", "code"), "captions": ("captions",), "docs": ("docs",)}
    got = pool_targets(pools, targets, max_workers={"captions": 4})
    assert got["text"] == PoolScale(
        "text", 3, "3 worker(s) of demand (chat: chat needs 0.4 cores; code: code needs 1.6 cores)")
    assert got["captions"].workers == 4 and got["captions"].reason.endswith("; capped at 4")
    assert "docs" not in got  # not sized yet: left alone


def test_the_minimum_holds_when_demand_is_zero():
    got = pool_targets({"text": ("chat",)}, {"chat": {"workers": 0, "reason": "idle"}}, min_workers=1)
    assert got["text"].workers == 1 and got["text"].reason.endswith("; at least 1")


def test_fractional_demands_are_added_before_rounding_up():
    targets = {name: {"workers": 1, "reason": f"{name} is cheap", "demand": 0.3}
               for name in ("chat", "scenes", "code")}
    got = pool_targets({"text": ("chat", "scenes", "code")}, targets)
    assert got["text"].workers == 1  # 0.9 worker-equivalents, not 3 rounded-up workers
    targets["code"]["demand"] = 0.5
    assert pool_targets({"text": ("chat", "scenes", "code")}, targets)["text"].workers == 2
