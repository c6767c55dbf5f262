"""The S3 fault tests never skip silently: without a runnable ``weed`` they fail, saying why.

Pure and fast (no cluster, no server started): :func:`s3_server.require_weed` is what the S3
fixtures call before starting SeaweedFS.
"""

from __future__ import annotations

import pytest

from s3_server import ALLOW_NO_WEED, require_weed


def test_a_missing_binary_fails_the_suite_naming_it(tmp_path):
    missing = str(tmp_path / "no-such-weed")
    with pytest.raises(pytest.fail.Exception, match=rf"cannot run.*{ALLOW_NO_WEED}=1") as info:
        require_weed(missing, env={})
    assert missing in str(info.value)


def test_a_binary_that_fails_fails_the_suite_with_its_error(tmp_path):
    broken = tmp_path / "weed"
    broken.write_text("#!/bin/sh\necho 'GLIBC_2.38 not found' >&2\nexit 3\n")
    broken.chmod(0o755)
    with pytest.raises(pytest.fail.Exception, match=r"failed \(3\): GLIBC_2.38 not found"):
        require_weed(str(broken), env={"CI": "true"})


def test_only_an_explicit_opt_out_turns_the_failure_into_a_skip_that_says_why(tmp_path):
    missing = str(tmp_path / "no-such-weed")
    with pytest.raises(pytest.fail.Exception):
        require_weed(missing, env={ALLOW_NO_WEED: "0"})
    with pytest.raises(pytest.skip.Exception, match=rf"cannot run.*skipped because {ALLOW_NO_WEED}=1"):
        require_weed(missing, env={ALLOW_NO_WEED: "1"})


def test_this_machine_runs_the_s3_fault_tests():
    """The dev extras install ``weed``: here the S3 fault tests run (or this fails, saying why)."""
    assert require_weed() is None
