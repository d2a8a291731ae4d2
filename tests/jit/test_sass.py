"""kvpatch.jit.sass: what nvcc produced, read back -- registers and spills from ``ptxas -v``,
``UBLKPF`` and floating-point ops per kernel from the SASS, the key loop's load-use distance,
and which instantiation a demangled kernel name is."""

from __future__ import annotations

from kvpatch.jit import KernelSignature, describe_kernel, parse_ptxas_log, scan_sass
from kvpatch.jit.sass import key_loop_load_use, scan_sass_kernels

PTXAS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_ZN13kvpatch_stock25paged_attention_v1_kernelIttLi128ELi16ELi128ELNS_18Fp8KVCacheDataTypeE0ELb0EEEvPT_' for 'sm_90a'
ptxas info    : Function properties for _ZN13kvpatch_stock25paged_attention_v1_kernelIttLi128ELi16ELi128ELNS_18Fp8KVCacheDataTypeE0ELb0EEEvPT_
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 96 registers, used 1 barriers, 288 bytes smem
ptxas info    : Compile time = 69.034 ms
"""


def test_parse_ptxas_log():
    sym = "_ZN13kvpatch_stock25paged_attention_v1_kernelIttLi128ELi16ELi128ELNS_18Fp8KVCacheDataTypeE0ELb0EEEvPT_"
    assert parse_ptxas_log(PTXAS) == {
        ("sm_90a", sym): {"registers": 96, "spill_stores": 4, "spill_loads": 12, "stack_bytes": 8}
    }


def test_scan_sass():
    sass = """\
	code for sm_90a
		Function : _Zpatched
        /*0450*/                   UBLKPF.L2 [UR4], UR5 ;
		Function : _Zreduce
        /*0000*/                   LDC R1, c[0x0][0x28] ;
	code for sm_80
		Function : _Zpatched
        /*0000*/                   LDC R1, c[0x0][0x28] ;
"""
    assert scan_sass(sass.splitlines()) == {
        ("sm_90a", "_Zpatched"): True,
        ("sm_90a", "_Zreduce"): False,
        ("sm_80", "_Zpatched"): False,
    }


def test_scan_sass_counts_floating_point_ops():
    sass = """\
	code for sm_90a
		Function : _Zk
        /*0010*/                   FFMA R1, R2, R3, R4 ;
        /*0020*/              @!P0 FFMA.FTZ R1, R2, R3, R4 ;
        /*0030*/                   HFMA2.MMA R5, -RZ, RZ, 0, 0 ;
        /*0040*/                   FMNMX R1, R2, R3, !PT ;
        /*0045*/                   MUFU.RCP R6, R7 ;
        /*0050*/                   UBLKPF.L2 [UR4], UR5 ;
        /*0060*/                   IMAD R1, R2, R3, R4 ;
        /*10000*/                  FFMA R1, R2, R3, R4 ;
"""
    # the last FFMA lies past 0xffff, where cuobjdump writes a fifth address digit
    found = scan_sass_kernels(sass.splitlines())
    assert {k: v[:3] for k, v in found.items()} == {("sm_90a", "_Zk"): (True, {"FFMA": 3, "FMNMX": 1, "MUFU": 1}, None)}


def _dump(namespace: str, predicate: str = "@!P0") -> str:
    """One kernel of a library built in ``namespace``, calling a helper of that namespace."""
    n = len(namespace)
    return f"""\
	code for sm_90a
		Function : _ZN{len(namespace)}{namespace}25paged_attention_v1_kernelIttLi128E
        /*0000*/                   LDC R1, c[0x0][0x28] ;                          /* 0x00000a00ff017b82 */
        /*0010*/              {predicate} FFMA R1, R2, R3, R4 ;              /* 0x0000000302017223 */
        /*0020*/                   CALL.REL.NOINC `(_ZN{n}{namespace}15kvpatch_helperEv) ;  /* 0x0000000000007944 */
        /*0030*/                   BRA 0x30 ;                                       /* 0xfffffffc00fc7947 */
"""


def test_the_sass_digest_names_the_code_whatever_namespace_the_library_was_built_in():
    """Before: two libraries built from one source in two namespaces (-Dvllm=kvpatch_<variant>),
    which SASS names in their kernels' and helpers' names, with other encodings' padding. After:
    one digest. Another predicate, another helper, or the namespace not removed: another digest."""

    def digest(text: str, namespace: str) -> str:
        ((_, found),) = scan_sass_kernels(text.splitlines(), namespace).items()
        return found.digest

    a = digest(_dump("kvpatch_stock"), "kvpatch_stock")
    assert a == digest(_dump("kvpatch_c4"), "kvpatch_c4") and len(a) == 16
    assert a == digest(_dump("kvpatch_c4").replace("  /* 0x", "      /* 0x"), "kvpatch_c4")
    assert a != digest(_dump("kvpatch_c4", predicate="@P0"), "kvpatch_c4")
    assert a != digest(_dump("kvpatch_c4", predicate="    "), "kvpatch_c4")
    assert a != digest(_dump("kvpatch_c4"), "")


def _loop_sass(gap: int) -> str:
    """A kernel whose key loop (4 LDG + an LDS, closed by a backward branch) uses each load
    ``gap`` instructions after issuing it; a short loop without loads before it."""
    body = ["IADD3 R2, R2, 0x1, RZ", "BRA 0x0010"]  # a loop of no interest (no loads)
    loop = [f"LDG.E.128.CONSTANT R{20 + 4 * i}, desc[UR4][R{60 + 2 * i}.64]" for i in range(4)]
    loop += ["IMAD R9, R9, 0x2, RZ"] * max(0, gap - 4) + ["LDS R8, [R3]"]
    loop += [f"HFMA2 R10, R{21 + 4 * i}, R8, R10" for i in range(4)]
    start = len(body)
    ins = body + loop + [f"@P0 BRA 0x{start * 16:04x}", "EXIT"]
    return "\tcode for sm_90a\n\t\tFunction : _Zk\n" + "".join(
        f"        /*{i * 16:04x}*/  {t} ;\n" for i, t in enumerate(ins)
    )


def test_key_loop_load_use_measures_how_far_ahead_loads_issue():
    far = scan_sass_kernels(_loop_sass(40).splitlines())[("sm_90a", "_Zk")].load_use
    near = scan_sass_kernels(_loop_sass(4).splitlines())[("sm_90a", "_Zk")].load_use
    # loads i = 0..3 used by the HFMA2 at 4 + pad + 1 + i: distance pad + 5 for each (pad = gap - 4)
    assert (far, near) == (41.0, 5.0)
    assert key_loop_load_use([(0, "LDG.E R1, desc[UR4][R2.64]"), (16, "BRA 0x0")]) is None  # no loop with an LDS
    assert key_loop_load_use([]) is None


def test_describe_kernel():
    sigs = {
        "v1": KernelSignature(
            "paged_attention_v1_kernel",
            ("scalar_t", "cache_t", "HEAD_SIZE", "BLOCK_SIZE", "NUM_THREADS", "KV_DTYPE", "IS_BLOCK_SPARSE"),
            (),
        ),
        "v2": KernelSignature("paged_attention_v2_kernel", (), ()),
        "reduce": KernelSignature(
            "paged_attention_v2_reduce_kernel", ("scalar_t", "HEAD_SIZE", "NUM_THREADS", "PARTITION_SIZE"), ()
        ),
    }
    name = "void kvpatch_x::paged_attention_v1_kernel<__nv_bfloat16, unsigned char, 128, 16, 128, (kvpatch_x::Fp8KVCacheDataType)1, false>(__nv_bfloat16*)"
    assert describe_kernel(name, sigs) == {
        "kernel": "v1",
        "dtype": "bf16",
        "kv_cache_dtype": "fp8",
        "head_size": 128,
        "block_size": 16,
    }
    name = "void kvpatch_x::paged_attention_v2_reduce_kernel<unsigned short, 64, 128, 512>(unsigned short*)"
    assert describe_kernel(name, sigs) == {
        "kernel": "reduce",
        "dtype": "fp16",
        "kv_cache_dtype": "",
        "head_size": 64,
        "block_size": 0,
    }
    assert describe_kernel("void other_kernel<int>()", sigs) is None
