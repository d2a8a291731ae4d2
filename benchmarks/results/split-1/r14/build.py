"""Run 14's libraries: kvpatch's own issue=split (not the hand edit of run 13), bf16 only."""
import pathlib, shutil, json, lzma
from kvpatch.config import make_config
from kvpatch import build as B
from kvpatch.build.spec import patched_variants
from kvpatch.gpu.commands import marker_of
T = pathlib.Path('.pytest_cache/d/kvpatch-cache/releases/v0.10.2').resolve()
h = T / 'csrc/attention/attention_kernels.cuh'
stock = h.read_text()
cfgs = {"t7": make_config(), "split": make_config(inherit_rules=False, issue="split"),
        "splitkv": make_config(inherit_rules=False, issue="split", scope="kv-head"), "paper": make_config(preset="paper")}
variants = patched_variants(stock, str(h), cfgs)
spec = B.make_spec(T, variants, "9.0a", dtypes=["bf16"], head_sizes=[64, 128, 256], block_sizes=[16, 32], kv_cache_dtypes=["auto"])
res = B.build(spec, check=False)
out = pathlib.Path('.gpu/x3/libs'); shutil.rmtree(out, ignore_errors=True); out.mkdir(parents=True)
lines, info = [], {}
markers = {v.name: marker_of(v.header) for v in variants}
for v in res.variants:
    (out / f"lib{v.prefix}.so.xz").write_bytes(lzma.compress(v.library.read_bytes()))
    lines.append(f"{v.name}=lib{v.prefix}.so:{v.prefix}")
    info[v.name] = {"marker": markers[v.name] or "stock", "compile_flags": list(v.compile_flags)}
(out / "libs.txt").write_text("\n".join(lines) + "\n")
(out / "variants.json").write_text(json.dumps(info, indent=1))
print(json.dumps({k: i["marker"][:120] for k, i in info.items()}, indent=1))
