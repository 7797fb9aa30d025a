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


def _compile_gluon_module(module: str) -> str:
    """Runs ``python -m module`` (a Gluon AOT compile for sm_90, outside the interpreter); its stdout."""
    import os
    import subprocess
    import sys

    from tritree.kernels import _verify_gluon

    if not _verify_gluon.GLUON_AVAILABLE:
        pytest.skip(f"this triton has no Gluon: {_verify_gluon._IMPORT_ERROR!r}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-m", module], capture_output=True, text=True, env=env, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return res.stdout


def test_gluon_verify_kernel_compiles_for_sm90():
    """The Gluon (Hopper) verify kernels, every variant, one split and several, TMA tiles (P = 64, 128)
    and row gathers (P = 1, 16 for plain and seesaw), fit the
    sm_90 shared-memory limit (``python -m tritree.kernels._verify_gluon`` exits non-zero otherwise);
    with programmatic dependent launch of the merge they signal it."""
    out = _compile_gluon_module("tritree.kernels._verify_gluon")
    assert out.count("_verify_gluon_kernel sm_90") == 26, out
    assert out.count("PDL: launch_dependents in the PTX") == 2, out  # the merge's early launch signal
    assert out.count("Q first: shared") == 2, out  # Q_FIRST / Q_FIRST_SEESAW, plain and seesaw
    assert out.count("coalesced store: shared") == 2, out  # TRITREE_COALESCED_STORE, plain and seesaw


def test_gluon_warp_specialized_verify_kernel_compiles_for_sm90():
    """The warp-specialised seesaw (``_verify_gluon_ws``: what verify_mla runs on sm_90 above 64 rows
    with its L2 prefetch and coalesced store, and above 16 rows for pages below 64; also without the
    prefetch), by column halves and by tiles, one split and several, P = 64 and 128, and its row
    gathers (P = 1, 16), and with a narrow last row block (8 or 16 rows), fit sm_90's shared memory."""
    out = _compile_gluon_module("tritree.kernels._verify_gluon_ws")
    assert out.count("_verify_gluon_ws_kernel sm_90") == 32, out
    assert out.count("last block part-filled") == 2, out  # two boxes a block without a narrow block
    assert out.count("rows: shared") == 4, out  # the narrow last row block
    assert out.count("launch_dependents in the PTX") == 4, out  # the merge's launch signal (at the start; after the store)
