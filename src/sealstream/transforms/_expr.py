"""Expressions of ``[transform]``: parsed by Polars' SQL expression parser
(:func:`polars.sql_expr`) after a scan that refuses what is not a pure, row-wise,
deterministic expression, naming the setting and the 1-based position.

The scan allows the SQL keywords of an expression (``and``, ``case``, ``cast``,
``in``, ``like``, ...) and an allow-list of row-wise functions (:data:`FUNCTIONS`);
it refuses the functions that read the clock or a random source (``now()``,
``current_date``, ``random()``...), aggregate and window functions (they would
depend on how events are split into batches), and any function it does not know.
"""

from __future__ import annotations

import re

import polars as pl

from sealstream.errors import SpecError

FUNCTIONS = frozenset({
    # numbers
    "abs", "cbrt", "ceil", "ceiling", "div", "exp", "floor", "ln", "log", "log10", "log1p",
    "log2", "mod", "pi", "pow", "power", "round", "sign", "sqrt", "trunc", "acos", "asin",
    "atan", "atan2", "cos", "cot", "sin", "tan", "degrees", "radians",
    # conditionals
    "coalesce", "greatest", "least", "if", "ifnull", "nullif",
    # text
    "bit_length", "concat", "concat_ws", "ends_with", "initcap", "left", "length",
    "char_length", "character_length", "lower", "ltrim", "octet_length", "regexp_like",
    "replace", "reverse", "right", "rtrim", "split_part", "starts_with", "strpos", "substr",
    "substring", "upper", "trim",
    # time
    "strptime", "strftime", "date", "timestamp", "date_part", "extract",
    # casts
    "cast", "try_cast",
})
"""Functions an expression may call (all row-wise and deterministic)."""

IMPURE = frozenset({
    "now", "current_date", "current_time", "current_timestamp", "localtime",
    "localtimestamp", "random", "rand", "uuid", "gen_random_uuid", "sysdate", "today",
})
_KEYWORDS = frozenset({
    "and", "or", "not", "in", "is", "null", "true", "false", "case", "when", "then", "else",
    "end", "between", "like", "ilike", "as", "distinct", "from", "for", "similar", "escape",
    "interval", "rlike", "regexp",
})
_TOKENS = re.compile(
    r"(?P<str>'(?:[^']|'')*'?)|(?P<qid>\"(?:[^\"]|\"\")*\"?)|(?P<id>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<ws>\s+)|(?P<other>.)",
    re.DOTALL,
)


def check_pure(setting: str, text: str) -> None:
    """Raise SpecError naming ``setting`` and the position (1-based) of the first
    function or word that makes ``text`` impure or not row-wise."""
    tokens = [(m.lastgroup, m.group(), m.start()) for m in _TOKENS.finditer(text)]
    for i, (kind, word, pos) in enumerate(tokens):
        if kind != "id":
            continue
        low = word.lower()
        nxt = next((t for t in tokens[i + 1:] if t[0] != "ws"), None)
        call = nxt is not None and nxt[1] == "("
        where = f"{setting} = {text!r}: at position {pos + 1}"
        if low in IMPURE:
            raise SpecError(f"{where}: {word} is not deterministic (it reads the clock or a "
                            "random source); a transform must give the same result on replay")
        if low == "over" and call:
            raise SpecError(f"{where}: window functions (OVER) are not allowed; an expression "
                            "sees one record at a time")
        if call and low not in FUNCTIONS and low not in _KEYWORDS:
            raise SpecError(f"{where}: {word}() is not an allowed function (a transform is "
                            "row-wise and deterministic: no aggregates, no window, clock or "
                            f"random functions); allowed: {', '.join(sorted(FUNCTIONS))}")


def parse_sql(setting: str, text: object) -> pl.Expr:
    """An SQL expression (a string) as a Polars expression, or SpecError."""
    if not isinstance(text, str) or not text.strip():
        raise SpecError(f"{setting}: expected an expression (a string such as "
                        f"\"latency_ms > 100\"), got {text!r}")
    check_pure(setting, text)
    try:
        return pl.sql_expr(text)
    except Exception as exc:  # noqa: BLE001 - polars raises several kinds; each is a spec error
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SpecError(f"{setting} = {text!r}: not a valid expression ({msg})") from None


_POLARS_IMPURE = (
    "python_udf", ".sample(", ".shuffle(", ".rolling", ".over(", ".shift(", ".diff(",
    ".cum_", ".rank(", ".sum()", ".mean()", ".count()", ".first()", ".last()", ".min()",
    ".max()", ".std(", ".var(", ".median(", ".quantile(", ".n_unique(", ".arg_", ".len()",
    "len()", ".implode(", ".sort(", ".unique(", ".slice(", ".head(", ".tail(", ".reverse(",
    ".is_duplicated(", ".is_unique(", ".is_first", ".is_last", ".forward_fill",
    ".backward_fill", ".interpolate(", ".gather(", ".top_k(", ".bottom_k(", ".mode(",
    ".product(", ".value_counts(", ".pct_change(", ".ewm_", ".cumulative_eval(",
)
"""Operations whose result depends on other rows (or on chance, or on Python code),
as they appear in a Polars expression's text."""
_QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')


def check_polars(setting: str, expr: object) -> pl.Expr:
    """A Polars expression given in Python: refused when its plan shows a function
    that is not row-wise or not deterministic (a best-effort check on its text)."""
    if not isinstance(expr, pl.Expr):
        raise SpecError(f"{setting}: expected a Polars expression or an SQL string, got "
                        f"{type(expr).__name__} {expr!r:.60}")
    shown = str(expr)
    # names and string literals are quoted in the text: blank them out (same length)
    bare = _QUOTED.sub(lambda m: '"' + " " * (len(m.group()) - 2) + '"', shown)
    for word in _POLARS_IMPURE:
        at = bare.find(word)
        if at >= 0:
            raise SpecError(f"{setting} = {shown!r}: at position {at + 1}: "
                            f"{word.strip('.(')} is not row-wise and deterministic; use "
                            "map_batches for what an expression cannot say")
    return expr
