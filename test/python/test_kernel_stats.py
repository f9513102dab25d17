"""utils/kernel-stats.py's reading of nvdisasm and cuobjdump output, on
hand-written listings: instructions counted (predicated ones too, labels
and directives not), the longest backward branch's loop found and its
overhead and loads split as the script documents, a forward branch not
taken for a loop, registers matched to their function; and a missing image
refused with the file's name."""
import importlib.util
import subprocess
import sys

from conftest import REPO

SCRIPT = REPO / "utils" / "kernel-stats.py"
spec = importlib.util.spec_from_file_location("kernel_stats", SCRIPT)
stats = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stats)

SASS = """
\t.text._Z3twov:
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   S2R R0, SR_TID.X ;
.L_x_0:
        /*0020*/                   LDG.E R2, desc[UR4][R4.64] ;
        /*0030*/                   FFMA R3, R2, R2, R3 ;
        /*0040*/               @P0 IADD3 R4, P1, R4, 0x4, RZ ;
        /*0050*/                   ISETP.NE.AND P0, PT, R4, R5, PT ;
        /*0060*/               @P0 BRA `(.L_x_0) ;
        /*0070*/                   BRA `(.L_x_1) ;
        /*0080*/                   NOP ;
.L_x_1:
        /*0090*/                   EXIT ;
\t.text._Z3onev:
        /*0000*/                   LDS R2, [R3] ;
.L_x_2:
        /*0010*/                   FADD R2, R2, 1 ;
        /*0020*/                   BRA `(.L_x_2) ;
"""


def test_functions_and_loops():
    got = stats.parse_functions(SASS)
    ops, loop = got["_Z3twov"]
    assert ops == ["LDC", "S2R", "LDG", "FFMA", "IADD3", "ISETP", "BRA",
                   "BRA", "NOP", "EXIT"]
    # .L_x_0 .. the backward BRA: LDG FFMA IADD3 ISETP BRA; the forward
    # branch to .L_x_1 is not a loop.
    assert loop == (5, 3, 1)
    ops, loop = got["_Z3onev"]
    assert ops == ["LDS", "FADD", "BRA"] and loop == (2, 1, 0)


def test_registers():
    usage = """
Resource usage:
 Common:
  GLOBAL:0
 Function _Z3twov:
  REG:40 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:544 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _Z3onev:
  REG:8 STACK:0 SHARED:0 LOCAL:0 CONSTANT[0]:352 TEXTURE:0 SURFACE:0 SAMPLER:0
"""
    assert stats.parse_registers(usage) == {"_Z3twov": 40, "_Z3onev": 8}


def test_missing_image(tmp_path):
    out = subprocess.run([sys.executable, SCRIPT, str(tmp_path / "no.fatbin")],
                         capture_output=True, text=True)
    assert out.returncode != 0
    assert "no.fatbin: no such file" in out.stderr
