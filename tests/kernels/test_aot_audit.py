"""Every config compiles ahead of time for its architecture within its shared-memory limit and
without register spills (sm_120: 101,376 B per block), on a machine without that GPU."""

import pytest

from tritree.kernels.aot import audit_in_subprocess


@pytest.mark.parametrize("arch", ["sm_120", "sm_90", "sm_80"])
def test_kernel_configs_compile(arch):
    reports = audit_in_subprocess((arch,))
    assert reports, f"no configs for {arch}"
    bad = [r for r in reports if not r.ok]
    assert not bad, "\n".join(f"{r.arch} {r.config}: shared {r.shared}/{r.shared_limit}, spill {r.spill_bytes}" for r in bad)
    for r in reports:
        assert r.registers > 0  # the resource report was read
