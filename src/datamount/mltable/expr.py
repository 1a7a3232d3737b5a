"""The `filter` expression language: parsed here, by hand (never eval()).

Grammar (keywords are case-insensitive):

    expr    := and_ ("or" and_)*
    and_    := not_ ("and" not_)*
    not_    := "not" not_ | compare
    compare := operand [ ("==" | "!=" | "<" | "<=" | ">" | ">=") operand
                       | "is" ["not"] "null" ]
    operand := primary ("." method "(" "string" ")")*
    primary := col("name") | name | "string" | 'string' | number
             | true | false | null | "(" expr ")"
             | datetime(year, month, day [, hour, minute, second])
             | method "(" operand "," "string" ")"
    method  := startswith

A column is `col("name")` (Azure ML's form, any name) or a bare identifier
(letters, digits, '_'). Strings take `\\"`-style escapes. Comparisons with a
null value are unknown (null), and a row is kept only when the whole
expression is true: `col("a") > 1` drops rows where `a` is null, exactly as
SQL. `and`/`or` use three-valued logic.

Evaluation (`evaluate`) works on a pyarrow RecordBatch with pyarrow.compute.
Pure functions; no threads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<num>[+-]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
    | (?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
    | (?P<op>==|!=|<=|>=|<|>|\(|\)|,|\.)
    | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
    )""",
    re.VERBOSE,
)
_COMPARE = {
    "==": pc.equal,
    "!=": pc.not_equal,
    "<": pc.less,
    "<=": pc.less_equal,
    ">": pc.greater,
    ">=": pc.greater_equal,
}
KEYWORDS = {"and", "or", "not", "is", "null", "true", "false", "col"}
# Azure ML's text function, as a method (`col("a").startswith("x")`) or a call
# (its runtime rejects endswith and contains, so datamount does too)
_TEXT_FUNCTIONS = {"startswith": pc.starts_with}


class ExprError(ValueError):
    pass


@dataclass(frozen=True)
class Column:
    name: str


@dataclass(frozen=True)
class Literal:
    value: Any  # str, int, float, bool or None


@dataclass(frozen=True)
class Compare:
    op: str
    left: Expr
    right: Expr


@dataclass(frozen=True)
class IsNull:
    operand: Expr
    negate: bool


@dataclass(frozen=True)
class BoolOp:
    op: str  # "and" | "or"
    left: Expr
    right: Expr


@dataclass(frozen=True)
class Not:
    operand: Expr


@dataclass(frozen=True)
class TextTest:
    fn: str  # a key of _TEXT_FUNCTIONS
    operand: Expr
    pattern: str


Expr = Column | Literal | Compare | IsNull | BoolOp | Not | TextTest


def _tokens(text: str) -> list[tuple[str, str, int]]:
    out, pos = [], 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            at = len(text) - len(text[pos:].lstrip())
            raise ExprError(f"unexpected {text[at : at + 10]!r} at position {at}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind), m.start(kind)))
        pos = m.end()
    return out


def parse(text: str) -> Expr:
    """Parse `text`; ExprError (a ValueError) names the problem and position."""
    parser = _Parser(_tokens(text), text)
    node = parser.expr()
    if parser.i < len(parser.toks):
        _, value, at = parser.toks[parser.i]
        raise ExprError(f"unexpected {value!r} at position {at}")
    return node


class _Parser:
    def __init__(self, toks: list[tuple[str, str, int]], text: str) -> None:
        self.toks, self.text, self.i = toks, text, 0

    def _peek(self) -> tuple[str, str, int] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def _keyword(self, word: str) -> bool:
        tok = self._peek()
        if tok and tok[0] == "name" and tok[1].lower() == word:
            self.i += 1
            return True
        return False

    def _expect(self, value: str) -> None:
        tok = self._peek()
        if tok is None or tok[1] != value:
            where = f"{tok[1]!r} at position {tok[2]}" if tok else "the end"
            raise ExprError(f"expected {value!r}, found {where}")
        self.i += 1

    def expr(self) -> Expr:
        node = self.and_()
        while self._keyword("or"):
            node = BoolOp("or", node, self.and_())
        return node

    def and_(self) -> Expr:
        node = self.not_()
        while self._keyword("and"):
            node = BoolOp("and", node, self.not_())
        return node

    def not_(self) -> Expr:
        if self._keyword("not"):
            return Not(self.not_())
        return self.compare()

    def compare(self) -> Expr:
        left = self.operand()
        tok = self._peek()
        if tok and tok[0] == "op" and tok[1] in _COMPARE:
            self.i += 1
            return Compare(tok[1], left, self.operand())
        if self._keyword("is"):
            negate = self._keyword("not")
            if not self._keyword("null"):
                raise ExprError("expected 'null' after 'is' / 'is not'")
            return IsNull(left, negate)
        return left

    def operand(self) -> Expr:
        node = self.primary()
        while (tok := self._peek()) and tok[1] == ".":
            self.i += 1
            method = self._peek()
            if method is None or method[1].lower() not in _TEXT_FUNCTIONS:
                where = f"{method[1]!r} at position {method[2]}" if method else "the end"
                raise ExprError(f"expected startswith, found {where}")
            self.i += 1
            self._expect("(")
            node = TextTest(method[1].lower(), node, self._string())
            self._expect(")")
        return node

    def _string(self) -> str:
        tok = self._peek()
        if tok is None or tok[0] != "str":
            where = f"{tok[1]!r} at position {tok[2]}" if tok else "the end"
            raise ExprError(f"expected a quoted string, found {where}")
        self.i += 1
        return _unquote(tok[1])

    def _call(self, word: str) -> Expr:
        """`datetime(2024, 1, 8)` or `startswith(col("a"), "x")` (after the name)."""
        self._expect("(")
        if word in _TEXT_FUNCTIONS:
            operand = self.operand()
            self._expect(",")
            node: Expr = TextTest(word, operand, self._string())
        else:
            parts: list[int] = []
            while (tok := self._peek()) and tok[0] == "num" and tok[1].lstrip("+-").isdigit():
                parts.append(int(tok[1]))
                self.i += 1
                if not (tok := self._peek()) or tok[1] != ",":
                    break
                self.i += 1
            if not 3 <= len(parts) <= 6:
                raise ExprError("datetime(...) takes year, month, day [, hour, minute, second]")
            try:
                node = Literal(datetime(*parts))  # type: ignore[arg-type]
            except ValueError as exc:
                raise ExprError(f"datetime{tuple(parts)}: {exc}") from None
        self._expect(")")
        return node

    def primary(self) -> Expr:
        tok = self._peek()
        if tok is None:
            raise ExprError("unexpected end of expression")
        kind, value, at = tok
        self.i += 1
        if kind == "num":
            number = float(value) if any(c in value for c in ".eE") else int(value)
            return Literal(number)
        if kind == "str":
            return Literal(_unquote(value))
        if kind == "op" and value == "(":
            node = self.expr()
            self._expect(")")
            return node
        if kind == "name":
            word = value.lower()
            if word == "col":
                self._expect("(")
                name = self._peek()
                if name is None or name[0] != "str":
                    raise ExprError(f"col(...) takes a quoted column name (position {at})")
                self.i += 1
                self._expect(")")
                return Column(_unquote(name[1]))
            nxt = self._peek()
            if word in ("datetime", *_TEXT_FUNCTIONS) and nxt is not None and nxt[1] == "(":
                return self._call(word)
            if word in ("true", "false"):
                return Literal(word == "true")
            if word == "null":
                return Literal(None)
            if word not in KEYWORDS:
                return Column(value)
        raise ExprError(f"unexpected {value!r} at position {at}")


def _unquote(token: str) -> str:
    return re.sub(r"\\(.)", r"\1", token[1:-1])


def columns_of(node: Expr) -> set[str]:
    if isinstance(node, Column):
        return {node.name}
    if isinstance(node, Literal):
        return set()
    if isinstance(node, Compare | BoolOp):
        return columns_of(node.left) | columns_of(node.right)
    if isinstance(node, TextTest):
        return columns_of(node.operand)
    return columns_of(node.operand)


# -- evaluation -------------------------------------------------------------


def mask(node: Expr, batch: pa.RecordBatch) -> pa.Array:
    """A boolean array (nulls = unknown) for the rows of `batch`."""
    value = _eval(node, batch)
    if isinstance(value, pa.Scalar):
        value = pa.array([value.as_py()] * batch.num_rows, type=value.type)
    if not pa.types.is_boolean(value.type) and not pa.types.is_null(value.type):
        raise ExprError("the filter expression is not a condition (true/false)")
    return value.cast(pa.bool_())


def _eval(node: Expr, batch: pa.RecordBatch) -> Any:
    if isinstance(node, Column):
        index = batch.schema.get_field_index(node.name)
        if index < 0:
            have = ", ".join(batch.schema.names)
            raise ExprError(f"no column {node.name!r} (columns: {have})")
        return batch.column(index)
    if isinstance(node, Literal):
        return pa.scalar(node.value)
    if isinstance(node, Compare):
        left, right = _eval(node.left, batch), _eval(node.right, batch)
        left, right = _align(left, right, node)
        return _COMPARE[node.op](left, right)
    if isinstance(node, IsNull):
        value = _eval(node.operand, batch)
        result = pc.is_null(value) if not isinstance(value, pa.Scalar) else value.is_valid
        if isinstance(result, bool):
            result = pa.scalar(not result)
        return pc.invert(result) if node.negate else result
    if isinstance(node, TextTest):
        value = _eval(node.operand, batch)
        if not (pa.types.is_string(value.type) or pa.types.is_large_string(value.type)):
            raise ExprError(f"{node.fn} takes a text column, not {value.type}")
        return _TEXT_FUNCTIONS[node.fn](value, pattern=node.pattern)
    if isinstance(node, BoolOp):
        fn = pc.and_kleene if node.op == "and" else pc.or_kleene
        return fn(_as_bool(_eval(node.left, batch)), _as_bool(_eval(node.right, batch)))
    return pc.invert(_as_bool(_eval(node.operand, batch)))


def _as_bool(value: Any) -> Any:
    if not pa.types.is_boolean(value.type) and not pa.types.is_null(value.type):
        raise ExprError("'and', 'or' and 'not' take conditions, not values")
    return value.cast(pa.bool_())


def _align(left: Any, right: Any, node: Compare) -> tuple[Any, Any]:
    """Cast a literal to its column's type (a date string against a datetime
    column, an int against a float column); refuse string-vs-number."""
    lt, rt = left.type, right.type
    if lt == rt or pa.types.is_null(lt) or pa.types.is_null(rt):
        return left, right
    numeric = pa.types.is_integer, pa.types.is_floating
    if any(f(lt) for f in numeric) and any(f(rt) for f in numeric):
        return left, right
    if isinstance(right, pa.Scalar) and not isinstance(left, pa.Scalar):
        return left, _cast(right, lt, node)
    if isinstance(left, pa.Scalar) and not isinstance(right, pa.Scalar):
        return _cast(left, rt, node), right
    raise ExprError(f"cannot compare {lt} with {rt} in {node.op!r}")


def _cast(scalar: pa.Scalar, to: pa.DataType, node: Compare) -> pa.Scalar:
    text_vs_number = pa.types.is_string(scalar.type) != (
        pa.types.is_string(to) or pa.types.is_large_string(to)
    ) and (
        pa.types.is_integer(to)
        or pa.types.is_floating(to)
        or pa.types.is_integer(scalar.type)
        or pa.types.is_floating(scalar.type)
    )
    if text_vs_number:
        raise ExprError(f"cannot compare a {to} column with {scalar.as_py()!r} in {node.op!r}")
    try:
        return scalar.cast(to)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise ExprError(
            f"cannot compare a {to} column with {scalar.as_py()!r} in {node.op!r}"
        ) from None
