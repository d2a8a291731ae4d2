"""Build one instantiation (head 128, block 16, auto cache) of vLLM 0.10.2 for stock and the
read=lane/warp forms of a few candidates, and print each library: ``python build_rw.py fp16``
(tune-11/tune-14's candidates) or ``bf16`` (the split forms tune-8/12 ship)."""
import sys
from dataclasses import replace

from kvpatch import build as B
from kvpatch.config import make_config
from kvpatch.source.fetch import fetch_release
from kvpatch.source.releases import HEADER
from kvpatch.tune import candidate_name

#: (issue, scope, lookahead, min-group) per dtype
CANDIDATES = {
    "fp16": (("call", "kv-head", 2, 2), ("inline", "kv-head", 2, 1), ("inline", "cta", 2, 1)),
    "bf16": (("split", "cta", 2, 1), ("split", "kv-head", 1, 1)),
}
dtype = sys.argv[1] if len(sys.argv) > 1 else "fp16"
tree = fetch_release("0.10.2")
path = tree / HEADER
stock = path.read_text()
base = make_config(inherit_rules=False, fp16="none", bf16="none", fp32="none", rules="none")
cands = {}
for issue, scope, la, mg in CANDIDATES[dtype]:
    for read in ("lane", "warp"):
        c = replace(base, issue=issue, scope=scope, lookahead=la, min_group=mg, read=read)
        cands[candidate_name(c)] = c
variants = B.patched_variants(stock, str(path), cands)
spec = B.make_spec(tree, variants, "9.0a", dtypes=[dtype], head_sizes=[128], block_sizes=[16], kv_cache_dtypes=["auto"])
res = B.build(spec, jobs=2)
for r in res.variants:
    print(r.name, r.library)
