import pathlib, re, shutil, json, lzma
from kvpatch.config import make_config
from kvpatch.patch.plan import patch
from kvpatch import build as B
from kvpatch.build.spec import Variant
T = pathlib.Path('.pytest_cache/d/kvpatch-cache/releases/v0.10.2').resolve()
h = T / 'csrc/attention/attention_kernels.cuh'
stock = h.read_text()
CALL = 'kvpatch_prefetch_l2<BLOCK_SIZE * HEAD_SIZE * sizeof(cache_t)>(kvpatch_tile);'
ASM = 'asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(reinterpret_cast<unsigned long long>(kvpatch_tile) & ~0xfULL), "n"(BLOCK_SIZE * HEAD_SIZE * sizeof(cache_t)));'
def value_inline(text):
    v = text.index("// kvpatch:begin value")
    e = text.index("// kvpatch:end value")
    n = text[v:e].count(CALL)
    assert n >= 1, n
    return text[:v] + text[v:e].replace(CALL, ASM) + text[e:]
t7 = patch(stock, str(h), make_config()).patched
callall = patch(stock, str(h), make_config(inherit_rules=False, issue="call", scope="cta", lookahead=1)).patched
paper = patch(stock, str(h), make_config(preset="paper")).patched
forms = {"stock": stock, "t7": t7, "mixed": value_inline(t7), "callall": callall, "mixall": value_inline(callall), "paper": paper}
variants = [Variant(n, t, expect_prefetch=(n != "stock")) for n, t in forms.items()]
spec = B.make_spec(T, variants, "9.0a", dtypes=["bf16"], head_sizes=[64, 128, 256], block_sizes=[16, 32], kv_cache_dtypes=["auto"])
res = B.build(spec, check=False)
out = pathlib.Path('.gpu/x1/libs'); shutil.rmtree(out, ignore_errors=True); out.mkdir(parents=True)
lines = []
info = {}
for v in res.variants:
    dst = out / f"lib{v.prefix}.so.xz"
    dst.write_bytes(lzma.compress(v.library.read_bytes()))
    lines.append(f"{v.name}=lib{v.prefix}.so:{v.prefix}")
    info[v.name] = {"marker": "stock" if v.name == "stock" else f"experiment {v.name}", "compile_flags": list(v.compile_flags)}
    print(v.name, [(k.kernel, k.head_size, k.block_size, k.registers) for k in v.kernels if k.kernel != "reduce"])
(out / "libs.txt").write_text("\n".join(lines) + "\n")
(out / "variants.json").write_text(json.dumps(info, indent=1))
