"""Crossover picking on synthetic timing grids (no GPU)."""

from __future__ import annotations

from ninfer_compile.tune.crossover import Candidate, pick_rows, sum_grids

GEMV = Candidate.make("q4_gemv", {}, 1, 4)
SMALL = Candidate.make("q4_small_t_mma", {}, 1, 64)
WIDE = Candidate.make("q4_wide_mma", {}, 1, None)
ALL = [GEMV, SMALL, WIDE]


def spans(rows):
    return [(r.lo, r.hi, None if r.candidate is None else r.candidate.key) for r in rows]


def test_plain_crossovers_cover_one_to_max():
    grid = {1: {GEMV: 10, SMALL: 30}, 2: {GEMV: 20, SMALL: 31}, 4: {GEMV: 40, SMALL: 32},
            8: {SMALL: 35, WIDE: 60}, 64: {SMALL: 90, WIDE: 70}, 256: {WIDE: 200}}
    rows = pick_rows(grid, ALL)
    assert spans(rows) == [(1, 3, "q4_gemv"), (4, 63, "q4_small_t_mma"), (64, None, "q4_wide_mma")]
    assert rows[0].lo == 1 and rows[-1].hi is None
    # evidence: µs per route at the T points inside each row
    assert rows[0].evidence == {1: {"q4_gemv": 10, "q4_small_t_mma": 30}, 2: {"q4_gemv": 20, "q4_small_t_mma": 31}}
    assert rows[2].evidence[256] == {"q4_wide_mma": 200}


def test_domain_limit_a_faster_route_with_max_t_4_never_gets_t5():
    # gemv is fastest everywhere it is measured, including a bogus T=8 entry outside its domain
    grid = {1: {GEMV: 1, SMALL: 30}, 4: {GEMV: 2, SMALL: 30}, 8: {GEMV: 3, SMALL: 30, WIDE: 50}}
    rows = pick_rows(grid, ALL)
    for r in rows:
        if r.route == "q4_gemv":
            assert r.hi is not None and r.hi <= 4
    assert spans(rows) == [(1, 4, "q4_gemv"), (5, 64, "q4_small_t_mma"), (65, None, "q4_wide_mma")]
    # the cut at max_t hands T 5..7 to the best covering route
    grid = {1: {GEMV: 1, SMALL: 30}, 4: {GEMV: 2, SMALL: 30}, 16: {SMALL: 50, WIDE: 40}}
    rows = pick_rows(grid, ALL)
    assert spans(rows) == [(1, 4, "q4_gemv"), (5, 15, "q4_small_t_mma"), (16, None, "q4_wide_mma")]


def test_beyond_the_largest_point_needs_an_unbounded_route():
    grid = {1: {SMALL: 10, WIDE: 20}, 32: {SMALL: 10, WIDE: 20}}
    rows = pick_rows(grid, ALL)
    # small won the largest point but its domain ends at 64: it keeps 32..64, wide takes max
    assert spans(rows) == [(1, 64, "q4_small_t_mma"), (65, None, "q4_wide_mma")]
    only_bounded = pick_rows({1: {SMALL: 10}, 32: {SMALL: 10}}, [SMALL])
    assert spans(only_bounded) == [(1, 64, "q4_small_t_mma"), (65, None, None)]
    assert "65..max" in only_bounded[-1].reason


def test_hysteresis_keeps_previous_unless_3_percent_faster():
    a = Candidate.make("a_route", {}, 1, None)
    b = Candidate.make("b_route", {}, 1, None)
    grid = {1: {a: 100, b: 101}, 2: {a: 100, b: 98}, 4: {a: 100, b: 97.5}, 8: {a: 100, b: 96.9}}
    rows = pick_rows(grid, [a, b])
    assert spans(rows) == [(1, 7, "a_route"), (8, None, "b_route")]
    # without hysteresis, b takes over at 2
    rows = pick_rows(grid, [a, b], hysteresis=0.0)
    assert spans(rows) == [(1, 1, "a_route"), (2, None, "b_route")]


def test_ties_are_deterministic_and_keep_the_previous_route():
    a = Candidate.make("a_route", {}, 1, None)
    b = Candidate.make("b_route", {}, 1, None)
    rows = pick_rows({1: {b: 50, a: 50}, 2: {a: 60, b: 60}}, [a, b])
    assert spans(rows) == [(1, None, "a_route")]
    rows = pick_rows({1: {a: 40, b: 50}, 2: {a: 60, b: 60}}, [a, b])
    assert spans(rows) == [(1, None, "a_route")]


def test_params_are_candidates_too():
    p16 = Candidate.make("q4_gemv", {"BLOCK_N": 16}, 1, 4)
    grid = {1: {GEMV: 10, p16: 8, SMALL: 30}, 2: {GEMV: 20, p16: 21, SMALL: 30}}
    rows = pick_rows(grid, ALL + [p16])
    assert rows[0].candidate == p16 and rows[0].candidate.params_dict == {"BLOCK_N": 16}
    # hysteresis kept BLOCK_N=16 at T=2 although default is 5% faster there? 20 <= 21*0.97 -> switch
    assert spans(rows)[:2] == [(1, 1, "q4_gemv{BLOCK_N=16}"), (2, 4, "q4_gemv")]
    # evidence lists the route's best and the row's own params when they differ
    grid = {1: {GEMV: 10, p16: 9.9}}
    rows = pick_rows({1: {GEMV: 10, p16: 10.1}, 2: {GEMV: 10, p16: 9.9}}, [GEMV, p16])
    assert rows[0].candidate == GEMV and rows[0].evidence[2] == {"q4_gemv": 9.9, "selected": 10}


def test_a_candidate_dropped_by_the_reference_check_is_never_chosen():
    # the fastest candidate failed its reference check: the measurer leaves it out of the grid
    broken = Candidate.make("q4_small_t_mma", {"SPLIT_K": 2}, 1, 64)
    grid = {1: {GEMV: 10, SMALL: 30}, 8: {SMALL: 35, WIDE: 60}}
    rows = pick_rows(grid, ALL + [broken])
    assert all(r.candidate != broken for r in rows)


def test_a_t_point_nobody_covers_becomes_unsupported():
    dec = Candidate.make("attention_decode_splitkv", {}, 1, 64)
    grid = {1: {dec: 5}, 64: {dec: 50}, 128: {}}
    rows = pick_rows(grid, [dec], what="attention {phase: decode}")
    assert spans(rows) == [(1, 64, "attention_decode_splitkv"), (65, None, None)]
    assert "attention {phase: decode}" in rows[-1].reason


def test_sum_grids_needs_the_candidate_everywhere():
    g1 = {1: {GEMV: 10, SMALL: 30}, 2: {GEMV: 12}}
    g2 = {1: {GEMV: 5}, 2: {GEMV: 6, SMALL: 7}}
    s = sum_grids([g1, g2])
    assert s == {1: {GEMV: 15.0}, 2: {GEMV: 18.0}}
