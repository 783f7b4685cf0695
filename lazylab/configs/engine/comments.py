"""Help text for config items, read from the class source.

The help of an item is the ``# comment`` block directly above its declaration, or a trailing comment on the
same line (with the comment lines below it that start in the same column, its continuation), or a string
literal on the line after it (an attribute docstring)::

    class Configs(BaseConfigs):
        # Number of features in the embedding
        d_model: int = 512
        dropout: float = 0.1  # dropout probability, on the attention weights
                              # and the FFN's hidden layer
        heads: int = 8        # attention heads

When the source is unavailable (interactive sessions, compiled code) the help is empty.
"""
import ast
import inspect
import io
import textwrap
import tokenize


def own_item_help(cls: type) -> dict[str, str]:
    """item -> help text for the items declared in ``cls``'s own body; ``{}`` if the source cannot be read."""
    cached = cls.__dict__.get('_lazylab_help')
    if cached is not None:
        return cached
    try:
        source = textwrap.dedent(inspect.getsource(cls))
        help_text = _parse(source)
    except (OSError, TypeError, SyntaxError, tokenize.TokenError, IndentationError):
        help_text = {}
    cls._lazylab_help = help_text
    return help_text


def item_help(cls: type) -> dict[str, str]:
    """item -> help text merged along the MRO (a subclass's comment replaces its parent's)."""
    merged: dict[str, str] = {}
    for c in reversed(cls.__mro__):
        if '_lazylab_decl' in c.__dict__:
            merged.update({k: v for k, v in own_item_help(c).items() if v})
    return merged


def _parse(source: str) -> dict[str, str]:
    comments: dict[int, tuple[int, str]] = {}  # line -> (column, comment text)
    code_lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = (tok.start[1], tok.string.lstrip('#').strip())
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                              tokenize.ENDMARKER):
            code_lines.add(tok.start[0])
    # A comment-only line right below a trailing comment, starting in the same column, continues it:
    #     threads: int = 1  # one CPU thread: the steps are
    #                       # too small to share
    # so it belongs to the item above (`threads`), not to the next one.
    trailing: dict[int, list[str]] = {}  # code line -> its trailing comment and continuation lines
    chain: dict[int, tuple[int, int]] = {}  # line -> (column of the comment, code line it continues)
    for line in sorted(comments):
        column, text = comments[line]
        if line in code_lines:
            trailing[line] = [text]
            chain[line] = (column, line)
        elif line - 1 in chain and chain[line - 1][0] == column:
            owner = chain[line - 1][1]
            trailing[owner].append(text)
            chain[line] = (column, owner)
    tree = ast.parse(source)
    classdef = next(n for n in tree.body if isinstance(n, ast.ClassDef))
    result: dict[str, str] = {}
    body = classdef.body
    for i, node in enumerate(body):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name = node.target.id
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
        else:
            continue
        above = []
        line = node.lineno - 1
        while line in comments and line not in code_lines and line not in chain:
            above.append(comments[line][1])
            line -= 1
        text = ' '.join(reversed(above))
        if not text:
            own = next((trailing[n] for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)
                        if n in trailing), [])
            text = ' '.join(own)
        if not text and i + 1 < len(body):
            nxt = body[i + 1]
            if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
                text = ' '.join(nxt.value.value.split())
        result[name] = text
    return result
