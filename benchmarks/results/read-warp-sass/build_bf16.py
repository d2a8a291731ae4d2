"""Build fp16 head 128 block 16 (auto cache) for stock and read=lane/warp candidates; compare SASS."""
import sys
from dataclasses import replace
from pathlib import Path
from kvpatch import build as B
from kvpatch.config import make_config
from kvpatch.source.fetch import fetch_release
from kvpatch.source.releases import HEADER
from kvpatch.tune import candidate_name

tree = fetch_release("0.10.2")
path = tree / HEADER
stock = path.read_text()
base = make_config(inherit_rules=False, fp16="none", bf16="none", fp32="none", rules="none")
cands = {}
for issue, scope, la, mg in (("split", "cta", 2, 1), ("split", "kv-head", 1, 1)):
    for read in ("lane", "warp"):
        c = replace(base, issue=issue, scope=scope, lookahead=la, min_group=mg, read=read)
        cands[candidate_name(c)] = c
variants = B.patched_variants(stock, str(path), cands)
spec = B.make_spec(tree, variants, "9.0a", dtypes=["bf16"], head_sizes=[128], block_sizes=[16], kv_cache_dtypes=["auto"])
res = B.build(spec, jobs=2)
for r in res.variants:
    print(r.name, r.library)
