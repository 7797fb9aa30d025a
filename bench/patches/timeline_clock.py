"""Adds ``TIMELINE=2`` to the ws verify kernel (``_verify_gluon_ws.py``) and ``_clock`` to
``_verify_gluon.py``: the five stamps become globaltimer at the start, SM clock at the start, (copy),
SM clock at the end, globaltimer at the end, so that cycles / ns is the SM clock the program ran at.
Applied by hand to a checked-out older kernel for a device call (session 16, call F); the same edit is in
the tree since. Usage: python bench/patches/timeline_clock.py DIR (the folder holding both files)."""
import sys

d = sys.argv[1]
g = open(f"{d}/_verify_gluon.py").read()
if "def _clock(" not in g:
    old = '''    @gluon.jit
    def _store_timeline('''
    assert g.count(old) == 1
    g = g.replace(old, '''    @gluon.jit
    def _clock(any_int):
        """``%clock`` (SM cycles, low 32 bits): ``TIMELINE=2``'s clock stamps."""
        return gl.inline_asm_elementwise("mov.u32 $0, %clock;", "=r,r", [any_int], dtype=gl.int32, is_pure=False,
                                         pack=1)

    @gluon.jit
    def _store_timeline(''')
    open(f"{d}/_verify_gluon.py", "w").write(g)
w = open(f"{d}/_verify_gluon_ws.py").read()
if "_clock(b)" not in w:
    for old, new in [
        ("_now, _page_row_p,", "_now, _clock, _page_row_p,"),
        ('''        if TIMELINE:
            t0 = _now(b)
        tree_len = gl.load(TreeLens + b)''', '''        if TIMELINE:
            t0 = _now(b)
            if TIMELINE == 2:  # the SM clock beside the timer (see launch_verify_gluon_ws' timeline)
                c0 = _clock(b)
        tree_len = gl.load(TreeLens + b)'''),
        ('''        if TIMELINE:
            _store_timeline(Lse, b, pid_m, pid_s, stride_lb, stride_lh, stride_ls, t0, t1, t2, t3, _now(b), BLOCK_M)''',
         '''        if TIMELINE == 2:
            c1 = _clock(b)
            _store_timeline(Lse, b, pid_m, pid_s, stride_lb, stride_lh, stride_ls, t0, c0, c0, c1, _now(b), BLOCK_M)
        elif TIMELINE:
            _store_timeline(Lse, b, pid_m, pid_s, stride_lb, stride_lh, stride_ls, t0, t1, t2, t3, _now(b), BLOCK_M)'''),
        ("TIMELINE=bool(timeline),", "TIMELINE=int(timeline),"),
        ("        TIMELINE: gl.constexpr = False,\n", "        TIMELINE: gl.constexpr = 0,\n"),
    ]:
        assert w.count(old) == 1, old
        w = w.replace(old, new)
    open(f"{d}/_verify_gluon_ws.py", "w").write(w)
print("patched", d)
