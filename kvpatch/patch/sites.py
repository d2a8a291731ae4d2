"""Where the key and value sites are: a pure function from header text to :class:`Sites`.

Everything is read off libclang's AST of ``paged_attention_kernel``:

* a *block loop* is a ``for`` statement whose increment is ``<var> += <stride>``,
  whose condition is ``<var> < <end>`` and whose body declares a variable
  initialised from ``<table>[<var>]`` (the physical block number);
* the key loop is the block loop whose body reads the ``k_cache`` parameter, the value
  loop the one that reads ``v_cache``;
* the tile address is the loop-invariant part of the pointer expression that starts
  at the cache parameter: ``cache + <block number> * <block stride> + <head offset>``,
  where the head offset is the sum of the terms that use only names declared
  outside the loop;
* the lane variable is the one initialised as ``... % WARP_SIZE``, and the KV-head
  index's initialiser ``<head> / <queries per kv>`` gives the GQA names;
* the ALiBi slope is the variable whose initialiser reads the ``alibi_slopes``
  parameter (``issue=split`` branches on it);
* what the grouped form calls from the header (:data:`GROUP_NEEDS`) and the header does not
  declare, at namespace scope, in itself or the files it includes.

Nothing is assumed about line numbers, formatting or comments: offsets are byte
offsets into the text given, and every expression the templates need is the
source text of an AST node.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import PatchError
from .cursors import (
    after_trailing_comment,
    flatten_sum,
    in_main_file,
    indent_at,
    left_sums,
    line_break_before,
    operator,
    own_line_break,
    ref_name,
    refs,
    span,
    strip_wrappers,
    text_of,
    walk,
)  # fmt: skip
from .interrupts import interruptible
from .libclang import CursorKind, ci
from .parse import Parsed, parse_header

K = CursorKind
FUNCTION = "paged_attention_kernel"
CACHE_PARAMS = {"key": "k_cache", "value": "v_cache"}
ALIBI_PARAM = "alibi_slopes"
#: What templates/inject/grouped.cuh.j2 calls from the header and the files it includes (vLLM's
#: vector types, products and reductions, dtype_float16.cuh's half2_to_float2, attention_utils.cuh's
#: Qk_dot, cuda_compat.h's shuffles, the attention macros): a header without one of them gets no
#: grouped form.
GROUP_NEEDS = ("Vec", "FloatVec", "Qk_dot", "block_sum", "from_float", "zero", "mul", "dot", "half2_to_float2",
               "VLLM_SHFL_XOR_SYNC", "VLLM_SHFL_SYNC", "WARP_SIZE", "MAX", "MIN", "DIVIDE_ROUND_UP")  # fmt: skip


@dataclass(frozen=True)
class Site:
    """One block loop: the C++ it names (``*_var``: a variable, ``*_expr``: an expression,
    ``*_param``: a kernel parameter), copied from the AST, and the byte offsets of the edits."""

    kind: str  # 'key' | 'value'
    cache_param: str  # the cache parameter the loop reads: 'k_cache'
    loop_var: str  # 'block_idx'
    stride_expr: str  # 'NUM_WARPS'
    end_expr: str  # 'end_block_idx'
    block_table_var: str  # 'block_table'
    block_number_var: str  # 'physical_block_number'
    block_stride_expr: str  # 'kv_block_stride'
    head_offset_expr: str  # 'kv_head_idx * kv_head_stride'
    line: int  # 1-based line of the ``for`` (reporting only)
    block_number_line: int
    #: Offset just past the ``;`` of the block-number declaration.
    after_block_number: int
    #: Indentation of the statements of the loop body.
    body_indent: str
    #: Offset just past the end of the loop body's last statement.
    body_last_end: int
    #: Offset just past the ``{`` of the innermost loop that loads the tile (the paper's spot).
    inner_open: int
    inner_var: str  # that loop's variable: 'j' (key) / 'i' (value)
    inner_indent: str
    #: The whole ``for`` statement: [loop_start, loop_end) (``issue=split`` copies it).
    loop_start: int = -1
    loop_end: int = -1
    #: Offset of the line break before the ``for``'s line, -1 when code precedes the
    #: ``for`` on that line (``issue=split`` inserts its branch there).
    before_loop: int = -1
    loop_indent: str = ""
    loop_text: str = ""  # the ``for`` statement's source, as written


@dataclass(frozen=True)
class Sites:
    """Both sites of one header plus the kernel-wide names."""

    function_line: int
    #: Offset of the line break before the line where ``template <...>`` of the kernel
    #: starts: where a helper function is inserted.
    before_function: int
    cache_type: str  # 'cache_t': the KV cache's element type (a template parameter)
    scalar_type: str  # 'scalar_t': the query/output type the kernels are instantiated with
    head_size_param: str  # 'HEAD_SIZE' (a template parameter)
    block_size_param: str  # 'BLOCK_SIZE' (a template parameter)
    partition_size_param: str  # 'PARTITION_SIZE' (a template parameter: 0 in the v1 kernel)
    lane_var: str  # 'lane'
    head_var: str  # 'head_idx'
    queries_per_kv_var: str  # 'num_queries_per_kv'
    key: Site
    value: Site
    newline: str = "\n"  # the header's line ending: generated code follows it
    alibi_var: str | None = None  # 'alibi_slope': the slope of the kernel's head (None: not found)
    #: what of GROUP_NEEDS the header lacks (the grouped form is left out where this is not empty)
    group_missing: tuple[str, ...] = ()

    def __iter__(self):
        return iter((self.key, self.value))


def _function(p: Parsed) -> ci.Cursor:
    """The header's one definition of the kernel (a second is refused: patching one leaves the other stock)."""
    found = [n for n in walk(p.tu.cursor) if n.kind == K.FUNCTION_TEMPLATE and n.spelling == FUNCTION
             and n.is_definition() and in_main_file(p, n)]  # fmt: skip
    if len(found) != 1:
        raise PatchError(f"{len(found)} definitions of {FUNCTION} (lines {', '.join(str(n.extent.start.line) for n in found)}"
                         f"): vLLM's header has one" if found else f"{FUNCTION} (a function template) not found in the header")  # fmt: skip
    return found[0]


@dataclass(frozen=True)
class _Loop:
    node: ci.Cursor
    var: str
    stride: str
    end: str
    body: ci.Cursor
    decl_stmt: ci.Cursor
    block_number: str
    block_table: str


def _block_loop(p: Parsed, node: ci.Cursor) -> _Loop | None:
    kids = list(node.get_children())
    if len(kids) != 4:
        return None
    init, cond, inc, body = kids
    if init.kind != K.DECL_STMT or body.kind != K.COMPOUND_STMT:
        return None
    decls = [c for c in init.get_children() if c.kind == K.VAR_DECL]
    if len(decls) != 1:
        return None
    var = decls[0].spelling
    if inc.kind != K.COMPOUND_ASSIGNMENT_OPERATOR or operator(p, inc) != "+=":
        return None
    inc_lhs, inc_rhs = inc.get_children()
    if ref_name(inc_lhs) != var:
        return None
    if cond.kind != K.BINARY_OPERATOR or operator(p, cond) != "<":
        return None
    cond_lhs, cond_rhs = cond.get_children()
    if ref_name(cond_lhs) != var:
        return None
    for stmt in body.get_children():
        if stmt.kind != K.DECL_STMT:
            continue
        for decl in stmt.get_children():
            if decl.kind != K.VAR_DECL:
                continue
            for sub in walk(decl):
                if sub.kind != K.ARRAY_SUBSCRIPT_EXPR:
                    continue
                base, index = sub.get_children()
                table = ref_name(base)
                if table and ref_name(index) == var:
                    return _Loop(node, var, text_of(p, inc_rhs), text_of(p, cond_rhs), body,
                                 stmt, decl.spelling, table)  # fmt: skip
    return None


def _tile_address(p: Parsed, loop: _Loop, cache: str) -> tuple[str, str, frozenset[str]]:
    """(block stride, head offset) from ``cache + number * stride + head terms ...``."""
    declared_inside = {c.spelling for c in walk(loop.body) if c.kind == K.VAR_DECL}
    read: set[tuple[int, int]] = set()  # each sum once: not again the sums down its left side
    for node in walk(loop.body):
        if node.kind != K.BINARY_OPERATOR or span(node) in read or operator(p, node) != "+":
            continue
        read |= left_sums(p, node)
        terms = flatten_sum(p, node)
        if ref_name(terms[0]) != cache:
            continue
        block_stride, head_terms, head_names = None, [], set()
        for term in terms[1:]:
            names = {r.spelling for r in refs(term)}
            if term.kind == K.BINARY_OPERATOR and operator(p, term) == "*" \
                    and loop.block_number in names:  # fmt: skip
                a, b = term.get_children()
                other = b if ref_name(a) == loop.block_number else a
                block_stride = text_of(p, other)
            elif not names & declared_inside:
                head_terms.append(text_of(p, term))
                head_names |= names
        if block_stride and head_terms:
            return block_stride, " + ".join(head_terms), frozenset(head_names)
    raise PatchError(
        f"no '{cache} + {loop.block_number} * <stride> + <head offset>' address found "
        f"in the loop at line {loop.node.extent.start.line}"
    )


def _inner_loop(p: Parsed, loop: _Loop, cache: str) -> ci.Cursor:
    """The innermost ``for`` that holds the cache read, else the first one after it."""
    ref = next(r for r in refs(loop.body) if r.spelling == cache)
    at = ref.extent.start.offset
    fors = [n for n in walk(loop.body) if n.kind == K.FOR_STMT]
    holding = [f for f in fors if f.extent.start.offset <= at < f.extent.end.offset]
    if holding:
        return holding[-1]
    after = [f for f in fors if f.extent.start.offset > at]
    if after:
        return after[0]
    raise PatchError(f"no inner loop over the {cache} tile in the loop at line "
                     f"{loop.node.extent.start.line}")  # fmt: skip


def _site(p: Parsed, kind: str, loop: _Loop, address: tuple[str, str, frozenset[str]]) -> Site:
    cache = CACHE_PARAMS[kind]
    block_stride, head_offset, _ = address
    inner = _inner_loop(p, loop, cache)
    inner_kids = list(inner.get_children())
    inner_body = inner_kids[-1]
    inner_decls = [c for c in inner_kids[0].get_children() if c.kind == K.VAR_DECL]
    if inner_body.kind != K.COMPOUND_STMT or not inner_decls:
        raise PatchError(f"unexpected shape of the inner {cache} loop at line "
                         f"{inner.extent.start.line}")  # fmt: skip
    inner_stmts = list(inner_body.get_children())
    body_stmts = list(loop.body.get_children())
    decl_end = loop.decl_stmt.extent.end.offset
    if p.data[decl_end - 1 : decl_end] != b";":
        raise PatchError(f"the {loop.block_number} declaration does not end in ';'")
    return Site(
        kind=kind,
        cache_param=cache,
        loop_var=loop.var,
        stride_expr=loop.stride,
        end_expr=loop.end,
        block_table_var=loop.block_table,
        block_number_var=loop.block_number,
        block_stride_expr=block_stride,
        head_offset_expr=head_offset,
        line=loop.node.extent.start.line,
        block_number_line=loop.decl_stmt.extent.start.line,
        after_block_number=after_trailing_comment(p, decl_end),
        body_indent=indent_at(p, loop.decl_stmt.extent.start.offset),
        body_last_end=after_trailing_comment(p, body_stmts[-1].extent.end.offset),
        inner_open=after_trailing_comment(p, inner_body.extent.start.offset + 1),
        inner_var=inner_decls[0].spelling,
        inner_indent=indent_at(p, inner_stmts[0].extent.start.offset) if inner_stmts else "",
        loop_start=loop.node.extent.start.offset,
        loop_end=loop.node.extent.end.offset,
        before_loop=own_line_break(p, loop.node.extent.start.offset),
        loop_indent=indent_at(p, loop.node.extent.start.offset),
        loop_text=p.data[loop.node.extent.start.offset : loop.node.extent.end.offset].decode(),
    )


def _kernel_names(p: Parsed, fn: ci.Cursor, cache_param: ci.Cursor) -> dict[str, str]:
    params = {c.spelling for c in fn.get_children() if c.kind == K.TEMPLATE_NON_TYPE_PARAMETER}
    for name in ("HEAD_SIZE", "BLOCK_SIZE"):
        if name not in params:
            raise PatchError(f"{FUNCTION} has no template parameter {name}")
    pointee = cache_param.type.get_pointee()
    cache_type = pointee.spelling.replace("const ", "").replace("volatile ", "").strip()
    lane = None
    body = [c for c in fn.get_children() if c.kind == K.COMPOUND_STMT][0]
    inits: dict[str, ci.Cursor] = {}
    for stmt in body.get_children():
        for decl in stmt.get_children() if stmt.kind == K.DECL_STMT else ():
            if decl.kind != K.VAR_DECL:
                continue
            init = [c for c in decl.get_children() if c.kind != K.TYPE_REF]
            if not init:
                continue
            inits[decl.spelling] = init[-1]
            toks = [t.spelling for t in init[-1].get_tokens()
                    if t.kind != ci.TokenKind.COMMENT and t.spelling not in "()"]  # fmt: skip
            if lane is None and toks[-2:] == ["%", "WARP_SIZE"]:
                lane = decl.spelling
    if lane is None:
        raise PatchError(f"no lane variable ('... % WARP_SIZE') in {FUNCTION}")
    others = [c.spelling for c in fn.get_children()
              if c.kind == K.TEMPLATE_TYPE_PARAMETER and c.spelling != cache_type]  # fmt: skip
    if not others:
        raise PatchError(f"{FUNCTION} has no template type parameter besides {cache_type}")
    return {"cache_type": cache_type, "scalar_type": others[0], "lane": lane, "_inits": inits}


@interruptible
def find_sites(text: str, header_path: str) -> Sites:
    """Locate the key and value sites of ``text`` (the header at ``header_path``)."""
    return sites_of(parse_header(text, header_path))


def sites_of(p: Parsed, exclude: tuple[tuple[int, int], ...] = ()) -> Sites:
    """Locate both sites in an already parsed header; loops that start inside an
    ``exclude`` range ``[start, end)`` do not count (kvpatch's own ``issue=split`` copy)."""
    fn = _function(p)
    params = {c.spelling: c for c in fn.get_children() if c.kind == K.PARM_DECL}
    for cache in CACHE_PARAMS.values():
        if cache not in params:
            raise PatchError(f"{FUNCTION} has no parameter {cache}")
    loops: dict[str, list[_Loop]] = {"key": [], "value": []}
    for node in walk(fn):
        if node.kind != K.FOR_STMT:
            continue
        if any(a <= node.extent.start.offset < b for a, b in exclude):
            continue
        loop = _block_loop(p, node)
        if loop is None:
            continue
        read = {r.spelling for r in refs(loop.body)}
        for kind, cache in CACHE_PARAMS.items():
            if cache in read:
                loops[kind].append(loop)
    for kind, found in loops.items():
        if len(found) != 1:
            what = "no" if not found else f"{len(found)}"
            raise PatchError(
                f"{what} {kind} block loop ('for (... ; <var> < <end>; <var> += <stride>)' "
                f"reading {CACHE_PARAMS[kind]} through <table>[<var>]) found in {FUNCTION}"
            )
    names = _kernel_names(p, fn, params["k_cache"])
    key_address = _tile_address(p, loops["key"][0], CACHE_PARAMS["key"])
    key = _site(p, "key", loops["key"][0], key_address)
    value = _site(p, "value", loops["value"][0], _tile_address(p, loops["value"][0], CACHE_PARAMS["value"]))
    if key.line >= value.line:
        raise PatchError("the key loop does not come before the value loop")
    head, qpk = _gqa_names(p, names["_inits"], key_address[2])
    return Sites(
        function_line=fn.extent.start.line,
        before_function=line_break_before(p, fn.extent.start.offset),
        cache_type=names["cache_type"],
        scalar_type=names["scalar_type"],
        head_size_param="HEAD_SIZE",
        block_size_param="BLOCK_SIZE",
        partition_size_param="PARTITION_SIZE",
        lane_var=names["lane"],
        head_var=head,
        queries_per_kv_var=qpk,
        key=key,
        value=value,
        newline="\r\n" if b"\r\n" in p.data else "\n",
        alibi_var=_alibi_name(names["_inits"], params.get(ALIBI_PARAM)),
        group_missing=_missing(p, GROUP_NEEDS),
    )


def _missing(p: Parsed, needed: tuple[str, ...]) -> tuple[str, ...]:
    """Those of ``needed`` that no declaration or macro definition at namespace scope names."""
    found: set[str] = set()
    scopes = [p.tu.cursor]
    while scopes:
        for node in scopes.pop().get_children():
            if node.kind == K.NAMESPACE:
                scopes.append(node)
            elif node.kind != K.MACRO_INSTANTIATION:
                found.add(node.spelling)
    return tuple(n for n in needed if n not in found)


def _alibi_name(inits: dict[str, ci.Cursor], param: ci.Cursor | None) -> str | None:
    """The variable initialised from the ``alibi_slopes`` parameter (the head's slope)."""
    if param is None:
        return None
    for name, init in inits.items():
        if any(r.spelling == ALIBI_PARAM for r in refs(init)):
            return name
    return None


def _gqa_names(p: Parsed, inits: dict[str, ci.Cursor], head_names: frozenset[str]) -> tuple[str, str]:
    """(query head, queries per KV head) from the KV head index's ``a / b`` initialiser.

    The KV head index is the variable of the tile address's head term that the
    function body declares (the other names there are parameters).
    """
    for name, init in inits.items():
        if name not in head_names:
            continue
        node = strip_wrappers(init)
        if node.kind == K.BINARY_OPERATOR and operator(p, node) == "/":
            a, b = node.get_children()
            if ref_name(a) and ref_name(b):
                return ref_name(a), ref_name(b)
    raise PatchError("no '<head> / <queries per kv>' initialiser for the KV head index")
