# _policy.py: what the PyTorch side adds to the layer policy (GCOLL_LAYER_POLICY): the
# `type:PATTERN` selector, which matches the class of the module that owns a parameter,
# the built-in policy "seed", and row-sparse compression of embedding tables by default.
# The C policy (lib/bucket/policy.c) knows names, sizes and first/last only; a type: rule
# is expanded here, in place, into one name rule per parameter it matches, so that the
# first matching rule still wins.
"""Layer policy helpers of gcoll.torch (docs/python.md, "Layer policy")."""

import fnmatch
import re

# The seed's rules ("conv layers tolerate 99% sparsity, fully connected less, batch norm
# uncompressed"), with embeddings by rows and gentler first and last layers. Top-k with
# error feedback (Lin et al. 2018, Deep Gradient Compression; Stich et al. 2018).
SEED_POLICY = ";".join([
    "type:*Norm*=none",
    "*bias*=none",
    "type:Embedding=rowsparse",
    "type:EmbeddingBag=rowsparse",
    "first=topk:density=0.1",
    "last=topk:density=0.1",
    "type:Conv*=topk:density=0.01",
    "type:Linear=topk:density=0.1",
    "*=topk:density=0.01",
])

# Embedding tables go row-sparse unless a rule says otherwise (rowsparse: lossless, the
# rows the batch touched; docs/compressors.md).
EMBEDDING_DEFAULT = "type:Embedding=rowsparse;type:EmbeddingBag=rowsparse"

_GLOB = re.compile(r"([*?\[])")


def _escape(name):
    """name as a glob that matches only itself (fnmatch: [*] is a literal *)."""
    return _GLOB.sub(r"[\1]", name)


def _class_name(mod):
    """The module's class name; FSDP2's fully_shard swaps a module's class for a subclass
    FSDP<Name> of (FSDPModule, <Name>): the user's class is the one a rule names."""
    cls = type(mod)
    while cls.__name__.startswith("FSDP") and len(cls.__bases__) > 1:
        rest = [b for b in cls.__bases__ if b.__name__ != "FSDPModule"]
        if not rest:
            break
        cls = rest[0]
    return cls.__name__


def module_info(model, by_module=False):
    """{name: (class name, row width or None)}: each parameter's owning module class (by
    parameter name), or with by_module each module's class (by module name, the root
    module as "root"). The row width is an Embedding's embedding_dim."""
    info = {}
    for mname, mod in model.named_modules():
        cls = _class_name(mod)
        dim = getattr(mod, "embedding_dim", None)
        if by_module:
            info[mname or "root"] = (cls, dim)
            continue
        for pname, _p in mod.named_parameters(recurse=False):
            info[(mname + "." if mname else "") + pname] = (cls, dim)
    # under DDP, parameters are "module.<name>" and named_modules() says the same
    return info


def _with_dim(spec, dim):
    """rowsparse without dim= gets the table's row width."""
    head = spec.split("+")[0]
    if head.split(":")[0] != "rowsparse" or dim is None or "dim=" in head:
        return spec
    rest = spec[len(head):]
    return (head + (",dim=%d" if ":" in head else ":dim=%d") % dim) + rest


def expand(policy, names, info, default_spec=None):
    """The policy with "seed" replaced by SEED_POLICY and every type:PATTERN rule replaced
    by name rules for the names (of info) whose class matches PATTERN; the embedding
    default appended unless default_spec is "none". Raises ValueError for a rule without
    '=' or an empty type pattern."""
    policy = (policy or "").strip()
    if policy == "seed":
        policy = SEED_POLICY
    elif policy.startswith("seed;"):
        policy = SEED_POLICY + policy[4:]
    rules = [r.strip() for r in policy.split(";") if r.strip()]
    if default_spec != "none":
        rules += EMBEDDING_DEFAULT.split(";")
    out = []
    for rule in rules:
        sel, eq, spec = rule.partition("=")
        if not eq:
            raise ValueError("layer policy rule %r: expected selector=spec" % rule)
        sel = sel.strip()
        if not sel.startswith("type:"):
            out.append(rule)
            continue
        pat = sel[5:]
        if not pat:
            raise ValueError("layer policy rule %r: type: needs a class name pattern "
                             "(type:Conv*, type:*Norm*, type:Embedding)" % rule)
        for n in names:
            cls, dim = info.get(n, ("", None))
            if fnmatch.fnmatchcase(cls, pat):
                out.append("%s=%s" % (_escape(n), _with_dim(spec.strip(), dim)))
    return ";".join(out)
