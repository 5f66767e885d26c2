"""LaTeX math → MathML for the static site (``tools/build_site.py``): no CDN, no JavaScript — Chromium, Firefox and
Safari draw MathML Core natively.

It covers the TeX the labs write (Greek, sub/superscripts, ``\\frac`` and friends, ``\\sqrt``, ``\\text`` /
``\\mathrm`` / ``\\mathcal`` / ``\\mathbb`` / ``\\operatorname``, accents, ``\\big`` sizes, ``\\left … \\right``,
spacing, ``cases`` / ``aligned`` / matrices). An unknown command is kept as its own name in ``<merror>`` and
collected in :data:`UNKNOWN`, so the build can say which ones it met.
"""
from __future__ import annotations

import html
import re

UNKNOWN: set[str] = set()

GREEK = {
    "alpha": "α", "beta": "β", "gamma": "γ", "delta": "δ", "epsilon": "ϵ", "varepsilon": "ε", "zeta": "ζ",
    "eta": "η", "theta": "θ", "vartheta": "ϑ", "iota": "ι", "kappa": "κ", "lambda": "λ", "mu": "μ", "nu": "ν",
    "xi": "ξ", "pi": "π", "varpi": "ϖ", "rho": "ρ", "varrho": "ϱ", "sigma": "σ", "varsigma": "ς", "tau": "τ",
    "upsilon": "υ", "phi": "ϕ", "varphi": "φ", "chi": "χ", "psi": "ψ", "omega": "ω",
    "Gamma": "Γ", "Delta": "Δ", "Theta": "Θ", "Lambda": "Λ", "Xi": "Ξ", "Pi": "Π", "Sigma": "Σ", "Upsilon": "Υ",
    "Phi": "Φ", "Psi": "Ψ", "Omega": "Ω",
}
IDENT = {"infty": "∞", "partial": "∂", "nabla": "∇", "ell": "ℓ", "hbar": "ℏ", "emptyset": "∅", "Re": "ℜ",
         "Im": "ℑ", "aleph": "ℵ", "prime": "′"}
OPS = {
    "cdot": "⋅", "times": "×", "div": "÷", "pm": "±", "mp": "∓", "mid": "∣", "in": "∈", "notin": "∉", "ni": "∋",
    "sim": "∼", "simeq": "≃", "approx": "≈", "cong": "≅", "ge": "≥", "geq": "≥", "le": "≤", "leq": "≤", "ne": "≠",
    "neq": "≠", "ll": "≪", "gg": "≫", "to": "→", "rightarrow": "→", "leftarrow": "←", "gets": "←",
    "Rightarrow": "⇒", "Leftarrow": "⇐", "Leftrightarrow": "⇔", "leftrightarrow": "↔", "mapsto": "↦",
    "implies": "⟹", "iff": "⟺", "uparrow": "↑", "downarrow": "↓", "gtrsim": "≳", "lesssim": "≲",
    "propto": "∝", "equiv": "≡", "circ": "∘", "star": "⋆", "ast": "∗", "odot": "⊙", "otimes": "⊗", "oplus": "⊕",
    "cup": "∪", "cap": "∩", "subset": "⊂", "subseteq": "⊆", "supset": "⊃", "forall": "∀", "exists": "∃",
    "neg": "¬", "land": "∧", "lor": "∨", "wedge": "∧", "vee": "∨", "setminus": "∖", "perp": "⊥",
    "dots": "…", "ldots": "…", "cdots": "⋯", "vdots": "⋮", "ddots": "⋱",
    "Vert": "‖", "lVert": "‖", "rVert": "‖", "|": "‖", "vert": "|", "lvert": "|", "rvert": "|",
    "lceil": "⌈", "rceil": "⌉", "lfloor": "⌊", "rfloor": "⌋", "langle": "⟨", "rangle": "⟩",
    "{": "{", "}": "}", "lbrace": "{", "rbrace": "}", "%": "%", "#": "#", "&": "&", "_": "_", "$": "$",
}
BIG_OPS = {"sum": "∑", "prod": "∏", "int": "∫", "oint": "∮", "bigcup": "⋃", "bigcap": "⋂"}
FUNCS = {"log", "ln", "exp", "sin", "cos", "tan", "tanh", "sinh", "cosh", "arg", "det", "dim", "deg", "gcd",
         "Pr", "sgn", "sign", "softmax", "clip", "var", "Var", "cov"}
LIMIT_FUNCS = {"max", "min", "lim", "sup", "inf", "argmax", "argmin", "limsup", "liminf"}
FONTS = {"mathcal": "script", "mathscr": "script", "mathbb": "double-struck", "mathrm": "normal",
         "mathbf": "bold", "boldsymbol": "bold-italic", "mathit": "italic", "mathsf": "sans-serif",
         "mathtt": "monospace", "mathfrak": "fraktur"}
TEXTS = {"text": None, "textrm": None, "mbox": None, "textit": "italic", "textbf": "bold", "texttt": "monospace",
         "textsf": "sans-serif"}
ACCENTS = {"hat": ("^", False), "widehat": ("^", True), "bar": ("¯", False), "overline": ("‾", True),
           "tilde": ("~", False), "widetilde": ("~", True), "vec": ("→", False), "dot": ("˙", False),
           "ddot": ("¨", False), "overrightarrow": ("→", True)}
SPACES = {",": "0.1667em", ":": "0.2222em", ">": "0.2222em", ";": "0.2778em", "!": "-0.1667em", " ": "0.3333em",
          "quad": "1em", "qquad": "2em", "enspace": "0.5em", "thinspace": "0.1667em"}
BIG = {"big": "1.2em", "Big": "1.8em", "bigg": "2.4em", "Bigg": "3em"}
DELIMS = set("()[]|./") | {"\\" + k for k in ("{", "}", "|", "langle", "rangle", "lVert", "rVert", "Vert",
                                               "lvert", "rvert", "vert", "lceil", "rceil", "lfloor", "rfloor",
                                               "lbrace", "rbrace")}

_TOKEN = re.compile(r"\\[a-zA-Z]+\*?|\\.|\d+(?:\.\d+)?|\s+|.", re.S)


def _esc(s: str) -> str:
    return html.escape(s, quote=False)


class _Parser:
    def __init__(self, tex: str, display: bool) -> None:
        self.toks = [t for t in _TOKEN.findall(tex)]
        self.i = 0
        self.display = display

    # -- token helpers
    def peek(self, skip_space: bool = True) -> str | None:
        j = self.i
        while skip_space and j < len(self.toks) and self.toks[j].isspace():
            j += 1
        return self.toks[j] if j < len(self.toks) else None

    def next(self, skip_space: bool = True) -> str | None:
        while skip_space and self.i < len(self.toks) and self.toks[self.i].isspace():
            self.i += 1
        if self.i >= len(self.toks):
            return None
        self.i += 1
        return self.toks[self.i - 1]

    def raw_group(self) -> str:
        """The source text of the next ``{…}`` group (or the next token)."""
        t = self.next()
        if t != "{":
            return t or ""
        depth, out = 1, []
        while self.i < len(self.toks):
            t = self.toks[self.i]
            self.i += 1
            if t == "{":
                depth += 1
            elif t == "}":
                depth -= 1
                if depth == 0:
                    break
            out.append(t)
        return "".join(out)

    # -- grammar
    def parse(self, stop: tuple[str, ...] = ()) -> str:
        items = []
        while True:
            t = self.peek()
            if t is None or t in stop:
                break
            if t == "}":
                self.next()
                continue
            items.append(self.item())
        return "".join(items)

    def item(self) -> str:
        t = self.peek()
        limits = t is not None and self.display and (t[1:] in BIG_OPS or t[1:] in LIMIT_FUNCS) and t[0] == "\\"
        base = self.atom()
        sub = sup = None
        while True:
            t = self.peek()
            if t == "_" and sub is None:
                self.next()
                sub = self.script()
            elif t == "^" and sup is None:
                self.next()
                sup = self.script()
            elif t == "'" and sup is None:
                primes = ""
                while self.peek(False) == "'":
                    self.next(False)
                    primes += "′"
                sup = f"<mo>{primes}</mo>"
            else:
                break
        if sub is None and sup is None:
            return base
        if limits:
            if sub is not None and sup is not None:
                return f"<munderover>{base}{sub}{sup}</munderover>"
            return f"<munder>{base}{sub}</munder>" if sub is not None else f"<mover>{base}{sup}</mover>"
        if sub is not None and sup is not None:
            return f"<msubsup>{base}{sub}{sup}</msubsup>"
        return f"<msub>{base}{sub}</msub>" if sub is not None else f"<msup>{base}{sup}</msup>"

    def script(self) -> str:
        if self.peek() == "{":
            return self.group()
        return self.atom()

    def group(self) -> str:
        self.next()  # {
        inner = self.parse(stop=("}",))
        self.next()  # }
        return f"<mrow>{inner}</mrow>"

    def arg(self) -> str:
        return self.group() if self.peek() == "{" else self.atom()

    def delim(self) -> str:
        t = self.next() or ""
        if t == ".":
            return ""
        if t.startswith("\\"):
            return OPS.get(t[1:], t[1:])
        return t

    def atom(self) -> str:
        t = self.next()
        if t is None:
            return ""
        if t == "{":
            self.i -= 1
            return self.group()
        if t.startswith("\\") and len(t) > 1:
            return self.command(t[1:])
        if t[0].isdigit():
            return f"<mn>{t}</mn>"
        if t.isalpha():
            return f"<mi>{_esc(t)}</mi>"
        if t == "~":
            return '<mspace width="0.3333em"></mspace>'
        if t == "-":
            return "<mo>−</mo>"
        if t in "([":
            return f'<mo stretchy="false">{t}</mo>'
        if t in ")]":
            return f'<mo stretchy="false">{t}</mo>'
        if t == "&":
            return ""
        return f"<mo>{_esc(t)}</mo>"

    def command(self, name: str) -> str:
        star = name.endswith("*")
        base = name.rstrip("*")
        if base in GREEK:
            v = GREEK[base]
            return f'<mi mathvariant="normal">{v}</mi>' if v.isupper() else f"<mi>{v}</mi>"
        if base in IDENT:
            return f"<mi>{IDENT[base]}</mi>"
        if base in SPACES:
            return f'<mspace width="{SPACES[base]}"></mspace>'
        if base in ("\\",):  # a line break outside an environment
            return ""
        if base in OPS:
            return f"<mo>{_esc(OPS[base])}</mo>"
        if base in BIG_OPS:
            return f'<mo largeop="true" movablelimits="true">{BIG_OPS[base]}</mo>'
        if base in FUNCS or base in LIMIT_FUNCS:
            label = {"argmax": "arg max", "argmin": "arg min"}.get(base, base)
            return f'<mi mathvariant="normal">{label}</mi><mo>&#x2061;</mo>'
        if base == "operatorname":
            return f'<mi mathvariant="normal">{_esc(self.text_of(self.raw_group()))}</mi><mo>&#x2061;</mo>'
        if base in ("frac", "dfrac", "tfrac", "cfrac"):
            num, den = self.arg(), self.arg()
            style = {"dfrac": ' displaystyle="true"', "tfrac": ' displaystyle="false"'}.get(base, "")
            frac = f"<mfrac>{num}{den}</mfrac>"
            return f"<mstyle{style}>{frac}</mstyle>" if style else frac
        if base == "binom":
            top, bot = self.arg(), self.arg()
            return f'<mrow><mo>(</mo><mfrac linethickness="0">{top}{bot}</mfrac><mo>)</mo></mrow>'
        if base == "sqrt":
            if self.peek() == "[":
                self.next()
                idx = self.parse(stop=("]",))
                self.next()
                return f"<mroot>{self.arg()}<mrow>{idx}</mrow></mroot>"
            return f"<msqrt>{self.arg()}</msqrt>"
        if base in FONTS:
            inner = self.raw_group()
            variant = FONTS[base]
            if re.fullmatch(r"[A-Za-z]+", inner):
                tag = "mi"
                return "".join(f'<{tag} mathvariant="{variant}">{c}</{tag}>' for c in inner) if variant != "normal" \
                    else f'<mi mathvariant="normal">{inner}</mi>'
            sub = _Parser(inner, self.display).parse()
            return f'<mstyle mathvariant="{variant}">{sub}</mstyle>'
        if base in TEXTS:
            text = self.text_of(self.raw_group())
            variant = TEXTS[base]
            attr = f' mathvariant="{variant}"' if variant else ""
            return f"<mtext{attr}>{_esc(text)}</mtext>"
        if base in ACCENTS:
            char, stretchy = ACCENTS[base]
            body = self.arg()
            return f'<mover accent="true">{body}<mo stretchy="{str(stretchy).lower()}">{char}</mo></mover>'
        if base == "underline":
            return f'<munder>{self.arg()}<mo stretchy="true">_</mo></munder>'
        if base in ("mathrel", "mathbin", "mathop", "mathord", "displaystyle", "textstyle", "limits", "nolimits"):
            return self.arg() if base.startswith("math") else ""
        m = re.fullmatch(r"(big|Big|bigg|Bigg)([lrm]?)", base)
        if m:
            size = BIG[m.group(1)]
            d = self.delim()
            return f'<mo minsize="{size}" maxsize="{size}" stretchy="true">{_esc(d)}</mo>'
        if base == "left":
            left = self.delim()
            inner = self.parse(stop=("\\right",))
            self.next()
            right = self.delim()
            return (f'<mrow><mo stretchy="true" fence="true">{_esc(left)}</mo>{inner}'
                    f'<mo stretchy="true" fence="true">{_esc(right)}</mo></mrow>')
        if base == "right":  # unmatched
            self.delim()
            return ""
        if base == "begin":
            return self.environment(self.raw_group())
        if base == "color":
            self.raw_group()
            return ""
        UNKNOWN.add("\\" + name + ("" if not star else ""))
        return f"<merror><mtext>\\{_esc(name)}</mtext></merror>"

    def text_of(self, raw: str) -> str:
        raw = re.sub(r"\\([{}_%#&$ ])", r"\1", raw)
        return raw.replace("~", "\u00a0")

    def environment(self, env: str) -> str:
        rows: list[list[str]] = [[]]
        cell: list[str] = []
        while True:
            t = self.peek()
            if t is None:
                break
            if t == "\\end":
                self.next()
                self.raw_group()
                break
            if t == "&":
                self.next()
                rows[-1].append("".join(cell))
                cell = []
                continue
            if t == "\\\\":
                self.next()
                if self.peek(False) == "[":  # \\[2pt]: extra row space, dropped
                    while self.next(False) not in (None, "]"):
                        pass
                rows[-1].append("".join(cell))
                cell = []
                rows.append([])
                continue
            cell.append(self.item())
        rows[-1].append("".join(cell))
        rows = [r for r in rows if any(c for c in r)]
        align = "left" if env in ("cases", "aligned", "align", "align*", "split", "array") else "center"
        table = "<mtable>" + "".join(
            "<mtr>" + "".join(f'<mtd style="text-align:{align}"><mrow>{c}</mrow></mtd>' for c in r) + "</mtr>"
            for r in rows) + "</mtable>"
        fences = {"cases": ("{", ""), "pmatrix": ("(", ")"), "bmatrix": ("[", "]"), "vmatrix": ("|", "|")}
        if env in fences:
            lo, hi = fences[env]
            return (f'<mrow><mo stretchy="true" fence="true">{lo}</mo>{table}'
                    + (f'<mo stretchy="true" fence="true">{hi}</mo>' if hi else "") + "</mrow>")
        return table


def to_mathml(tex: str, display: bool = False) -> str:
    """``tex`` (without the dollars) as one ``<math>`` element."""
    body = _Parser(tex, display).parse()
    attr = ' display="block"' if display else ""
    return (f'<math{attr}><semantics><mrow>{body}</mrow>'
            f'<annotation encoding="application/x-tex">{_esc(tex.strip())}</annotation></semantics></math>')
