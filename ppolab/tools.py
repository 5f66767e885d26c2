"""The tools a multi-turn agent rollout can call (``ppolab.rollout.agent``).

Only one for now: an integer calculator. A tool takes the text the model wrote between the call markers
and returns the observation text; it never raises — a malformed, too long or too large call gives an
``error: ...`` observation the policy has to live with, as a real environment would.
"""
from __future__ import annotations

import re

MAX_EXPR_CHARS = 64  # longer calls are refused before parsing
MAX_DIGITS = 12  # per integer literal
MAX_ABS = 10**12  # any intermediate or final value beyond this is refused ("error: too big")
MAX_DEPTH = 16  # parentheses / unary minus nesting

_TOKEN = re.compile(r"\s*(?:([0-9]+)|(.))", re.DOTALL)


class _CalcError(Exception):
    pass


def _tokens(expr: str) -> list[str]:
    out = []
    for number, other in _TOKEN.findall(expr):
        if number:
            if len(number) > MAX_DIGITS:
                raise _CalcError("too big")
            out.append(number)
        elif other.strip():
            if other not in "+-*()":
                raise _CalcError("syntax")
            out.append(other)
    return out


class _Parser:
    """expr := term (('+'|'-') term)* ; term := factor ('*' factor)* ; factor := '-' factor | int | '(' expr ')'."""

    def __init__(self, tokens: list[str]):
        self.tokens, self.pos, self.depth = tokens, 0, 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        tok = self.peek()
        if tok is None:
            raise _CalcError("syntax")
        self.pos += 1
        return tok

    @staticmethod
    def check(value: int) -> int:
        if abs(value) > MAX_ABS:
            raise _CalcError("too big")
        return value

    def expr(self) -> int:
        value = self.term()
        while self.peek() in ("+", "-"):
            op = self.take()
            rhs = self.term()
            value = self.check(value + rhs if op == "+" else value - rhs)
        return value

    def term(self) -> int:
        value = self.factor()
        while self.peek() == "*":
            self.take()
            value = self.check(value * self.factor())
        return value

    def factor(self) -> int:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _CalcError("too deep")
        try:
            tok = self.take()
            if tok == "-":
                return -self.factor()
            if tok == "(":
                value = self.expr()
                if self.take() != ")":
                    raise _CalcError("syntax")
                return value
            if tok.isascii() and tok.isdigit():
                return self.check(int(tok))
            raise _CalcError("syntax")
        finally:
            self.depth -= 1


def calculator(expr: str) -> str:
    """Evaluate integers with ``+ - *``, unary minus and parentheses (no ``eval``); the result as text.

    Anything else — other characters, a dangling operator, unbalanced parentheses, more than
    ``MAX_EXPR_CHARS`` characters, a literal over ``MAX_DIGITS`` digits, a value beyond ``MAX_ABS``, nesting
    deeper than ``MAX_DEPTH`` — gives ``"error: <why>"``; it never raises.
    """
    try:
        if not isinstance(expr, str):
            return "error: syntax"
        if len(expr) > MAX_EXPR_CHARS:
            return "error: too long"
        tokens = _tokens(expr)
        if not tokens:
            return "error: empty"
        parser = _Parser(tokens)
        value = parser.expr()
        if parser.pos != len(tokens):
            return "error: syntax"
        return str(value)
    except _CalcError as e:
        return f"error: {e}"
    except Exception:  # noqa: BLE001 — a tool must answer, whatever the model wrote
        return "error: syntax"


#: Tools by name; the agent loop calls ``TOOLS[name](call_text)``.
TOOLS = {"calculator": calculator}
