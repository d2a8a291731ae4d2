import pathlib, re, shutil, json, lzma, gzip, collections
from kvpatch.config import make_config
from kvpatch.patch.plan import patch
from kvpatch import build as B
from kvpatch.build.spec import Variant
T = pathlib.Path('.pytest_cache/d/kvpatch-cache/releases/v0.10.2').resolve()
h = T / 'csrc/attention/attention_kernels.cuh'
stock = h.read_text()
HEAD = "  for (int block_idx = start_block_idx + warp_idx; block_idx < end_block_idx;"
def loop_span(text):
    s = text.index(HEAD)
    i = text.index("{", s); depth = 0
    for j in range(i, len(text)):
        if text[j] == "{": depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return s, j + 1
    raise ValueError
def split(text):
    s, e = loop_span(text)
    loop = text[s:e]
    b = loop.index("    // kvpatch:begin key"); x = loop.index("// kvpatch:end key\n") + len("// kvpatch:end key\n")
    plain = loop[:b] + loop[x:]
    new = ("  if (alibi_slope != 0) {  // kvpatch: ALiBi keeps stock's loop (nvcc unswitches it the same way)\n" + plain +
           "\n  } else {\n" + loop + "\n  }")
    return text[:s] + new + text[e:]
inline = patch(stock, str(h), make_config(inherit_rules=False, issue="inline", scope="cta", lookahead=1)).patched
paper = patch(stock, str(h), make_config(preset="paper")).patched
t7 = patch(stock, str(h), make_config()).patched
forms = {"stock": stock, "t7": t7, "inline": inline, "split": split(inline), "paper": paper}
pathlib.Path('/tmp/asmx/split.cuh').write_text(forms["split"])
variants = [Variant(n, t, expect_prefetch=(n != "stock")) for n, t in forms.items()]
spec = B.make_spec(T, variants, "9.0a", dtypes=["bf16"], head_sizes=[64, 128, 256], block_sizes=[16, 32], kv_cache_dtypes=["auto"])
res = B.build(spec, check=False)
out = pathlib.Path('.gpu/x2/libs'); shutil.rmtree(out, ignore_errors=True); out.mkdir(parents=True)
lines, info = [], {}
FP = re.compile(r"(FFMA|FADD|FMUL|FSEL|FMNMX)")
for v in res.variants:
    (out / f"lib{v.prefix}.so.xz").write_bytes(lzma.compress(v.library.read_bytes()))
    lines.append(f"{v.name}=lib{v.prefix}.so:{v.prefix}")
    info[v.name] = {"marker": "stock" if v.name == "stock" else f"experiment {v.name}", "compile_flags": list(v.compile_flags)}
    cnt = collections.defaultdict(collections.Counter); cur = None
    for line in gzip.open(v.sass, "rt"):
        m = re.match(r"\s*Function : (\S+)", line)
        if m: cur = m.group(1); continue
        m = re.search(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", line)
        if cur and m and FP.match(m.group(1)): cnt[cur]["FFMA" if m.group(1).startswith("FFMA") else "other"] += 1
    print(v.name, [(k.kernel, k.head_size, k.block_size, k.registers, cnt[k.symbol]["FFMA"]) for k in v.kernels if k.kernel != "reduce"])
(out / "libs.txt").write_text("\n".join(lines) + "\n")
(out / "variants.json").write_text(json.dumps(info, indent=1))
