"""bench/gemv_sass.py on the CPU: the K loop it picks from SASS, the floors it derives, the variant
tables it writes, and one clear line for a plan without binaries."""

import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import gemv_sass as S  # noqa: E402

# two backward branches: a short index loop (no bf16x2 FMA) and the K loop (4 HFMA-class of 10)
SASS = """
        Function : gemv_lowreg_kernel
        /*0000*/                   S2R R0, SR_CTAID.X ;                                /* 0x0000000000007919 */
        /*0010*/                   IADD3 R1, R0, 0x1, RZ ;                             /* 0x0000000100017810 */
        /*0020*/               @P0 BRA 0x10 ;                                          /* 0xfffffff000000947 */
        /*0030*/                   LDG.E.NA.128.CONSTANT R8, desc[UR4][R2.64] ;        /* 0x0000000402087981 */
        /*0040*/                   PRMT R4, R8, 0x5410, R9 ;                           /* 0x0000541008047816 */
        /*0050*/              @!P1 LOP3.LUT R6, R4, 0xf000f, RZ, 0xc0, !PT ;           /* 0x000f000f04067812 */
        /*0060*/                   HFMA2.BF16_V2 R7, R6, 1, 1, R5 ;                    /* 0x000000080607723a */
        /*0070*/                   HFMA2.MMA.BF16_V2 R7, R7, R10, -RZ ;                /* 0x000000080607723a */
        /*0080*/                   HMUL2.BF16_V2 R11, R6, R10 ;                        /* 0x000000080607723a */
        /*0090*/                   HFMA2.BF16_V2 R12, R6, 1, 1, R5 ;                   /* 0x000000080607723a */
        /*00a0*/                   FADD R13, R7, R11 ;                                 /* 0x000000080607723a */
        /*00b0*/                   IMAD.WIDE R2, R0, 0x10, R2 ;                        /* 0x000000080607723a */
        /*00c0*/               @P1 BRA 0x30 ;                                          /* 0xffffffe400b41947 */
        /*00d0*/                   EXIT ;                                              /* 0x000000000000794d */
"""


def test_k_loop_is_the_backward_branch_with_the_bf16x2_fmas():
    ins = S.parse_sass(SASS)
    assert S.loops(ins) == [(0x10, 0x20), (0x30, 0xC0)]
    loop = S.k_loop(ins)
    assert (loop["start"], loop["end"], loop["body"], loop["n_hfma"]) == (0x30, 0xC0, 10, 4)
    assert loop["classes"] == {"mem": 1, "alu": 2, "fma": 5, "imad": 1, "other": 1}
    assert loop["opcodes"]["LOP3.LUT"] == 1 and S.opcode("@!UP0 HFMA2.MMA.BF16_V2 R1, R2") == "HFMA2.MMA.BF16_V2"
    assert S.k_loop(S.parse_sass(SASS.replace("HFMA2", "FFMA").replace("HMUL2", "FMUL"))) is None


def test_norm_prologue_scalings_and_constant_moves_are_not_weights():
    """With the RMSNorm prologue each x pair is scaled by `fma x, w, x` (addend = first factor), and
    ptxas sets constants with `HFMA2 R, -RZ, RZ, imm`: neither is a weight (as sm_90 SASS writes them)."""
    body = """
        /*0000*/                   LDG.E.NA.128.CONSTANT R8, desc[UR4][R2.64] ;
        /*0010*/                   HFMA2.MMA R63, -RZ, RZ, 3.515625, 3.515625 ;
        /*0020*/                   HFMA2.MMA.BF16_V2 R67, R12, R8, R12 ;
        /*0030*/                   HFMA2.MMA.BF16_V2 R9, R13, R9, R13 ;
        /*0040*/                   HFMA2.BF16_V2 R66, R66, R3.reuse.H0_H0, -136, -136 ;
        /*0050*/                   HMUL2.BF16_V2 R16, R16, R24 ;
        /*0060*/                   HFMA2.BF16_V2 R7, R61, R7, R66 ;
        /*0070*/               @P1 BRA 0x0 ;
"""
    loop = S.k_loop(S.parse_sass(body))
    assert (loop["body"], loop["n_hfma"], loop["n_scale"]) == (8, 3, 2)
    assert S.is_norm_scale("HFMA2.MMA.BF16_V2 R67, R12, R8, R12")
    assert not S.is_norm_scale("HFMA2.BF16_V2 R7, R61, R7, R66")  # a dot product: accumulates into R66
    assert not S.is_norm_scale("HFMA2.BF16_V2 R66, R66, R3.reuse.H0_H0, -136, -136")  # a bias removal


def test_floors_are_weights_times_instructions_over_the_slots():
    loop = {"body": 403, "n_hfma": 128, "classes": {"alu": 199, "fma": 182, "imad": 9, "mem": 12}}
    f = S.floors_us(loop, 34816, 5120, 1.98)
    slots_per_us = 132 * 4 * 1.98e3
    warp_instr = 34816 * 5120 / (32 * 128)  # loop passes x warps, per instruction of the body
    assert f["issue"] == pytest.approx(warp_instr * 403 / slots_per_us)
    assert f["alu"] == pytest.approx(warp_instr * 2 * 199 / slots_per_us)
    assert f["fma"] == pytest.approx(warp_instr * (182 + 18) / slots_per_us)
    assert f["instr_per_weight"] == pytest.approx(403 / 128)
    assert 16 < f["issue"] < 17.5  # gate_up at T=1 as compiled for sm_90 (bench/results)


def test_variant_table_sets_every_t1_lowreg_row(tmp_path):
    base = tmp_path / "sm90.yaml"
    base.write_text(yaml.safe_dump({"sm": 90, "linear": [{"match": {"n": 8}, "routes": [
        {"t": [1, 1], "route": "q5_gemv_lowreg", "params": {"BLOCK_N": 2, "PREFETCH": True, "L2_HINT": True}},
        {"t": [2, 4], "route": "q5_gemv_tc", "params": {"PREFETCH": True}}]}]}))
    S.variant_table(base, S._parse_variant("ASYNC=4,CHAIN=2"), tmp_path / "v.yaml")
    rows = yaml.safe_load((tmp_path / "v.yaml").read_text())["linear"][0]["routes"]
    assert rows[0]["params"] == {"BLOCK_N": 2, "PREFETCH": False, "L2_HINT": False, "ASYNC": 4, "CHAIN": 2}
    assert rows[1]["params"] == {"PREFETCH": True}
    base.write_text(yaml.safe_dump({"sm": 90, "linear": []}))
    with pytest.raises(SystemExit, match="no T=1 low-register rows to vary"):
        S.variant_table(base, {"ASYNC": 3}, tmp_path / "w.yaml")
    with pytest.raises(SystemExit, match=r"--variant 'ASYNC': want KEY=VAL"):
        S._parse_variant("ASYNC")


def test_a_plan_without_binaries_is_one_line(tmp_path):
    (tmp_path / "p.plan").mkdir()
    (tmp_path / "p.plan" / "plan.json").write_text('{"extents": {}}')
    with pytest.raises(SystemExit, match=r"p\.plan: no kernels/bin/manifest\.json"):
        S.analyze(tmp_path / "p.plan", "decode_c1_k0", 1.98, 4.08)
