"""bench/gemv_ncu.py on the CPU: the SASS opcode count it reports, and one clear line without ncu."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import gemv_ncu as N  # noqa: E402

SASS = """
        Function : gemv_lowreg_kernel
        /*0000*/                   LDC R1, c[0x0][0x28] ;                              /* 0x00000a00ff017b82 */
        /*0010*/                   S2R R0, SR_CTAID.X ;                                /* 0x0000000000007919 */
        /*0020*/              @!P0 LOP3.LUT R3, R2, 0xf000f, RZ, 0xc0, !PT ;           /* 0x000f000f02037812 */
        /*0030*/                   PRMT R4, R2, 0x5410, R5 ;                           /* 0x0000541002047816 */
        /*0040*/                   LOP3.LUT R6, R4, 0xf000f, RZ, 0xc0, !PT ;           /* 0x000f000f04067812 */
        /*0050*/               @P1 HFMA2.BF16_V2 R7, R6, R8, -RZ ;                     /* 0x000000080607723a */
        /*0060*/                   LDG.E.128.CONSTANT R8, desc[UR4][R2.64] ;           /* 0x0000000402087981 */
        /*0070*/                   EXIT ;                                              /* 0x000000000000794d */
"""


def test_opcode_counts_strip_modifiers_and_predicates():
    ops = N.opcode_counts(SASS)
    assert ops == {"LDC": 1, "S2R": 1, "LOP3": 2, "PRMT": 1, "HFMA2": 1, "LDG": 1, "EXIT": 1}


def test_no_ncu_is_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(N.shutil, "which", lambda name: None)
    assert N.main(["--out", str(tmp_path)]) == 2
    assert capsys.readouterr().out.strip() == "error: ncu (Nsight Compute) is not on the PATH"
    assert N.main(["--out", str(tmp_path), "--t", "1,x"]) == 2
