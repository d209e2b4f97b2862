"""A small PromQL parser for the label checks of the dashboard and rule lint.

`metric_names` in obslib only says which metrics an expression names. The catalog also says
which labels each metric has and, for some, which values a label takes; a panel or rule that
groups by a label its metric does not carry, matches a value that never occurs, or writes a
legend from a label the result does not have is valid PromQL, runs, and silently shows
nothing (or one unlabelled line). This module parses the expressions we write (selectors,
functions, aggregations, binary operators with vector matching, ranges, subqueries, offsets)
and infers which labels every sub-expression's series can carry, so those mistakes become
lint problems:

    problems, labels = check(expr, catalog)     # labels: what the result's series can carry

`catalog` is obslib.load_catalog(). Grafana variables must be substituted first
(obslib.substitute). Standard library only.
"""

import re

# Labels Prometheus attaches to every scraped series.
TARGET_LABELS = {"instance", "job"}
# Series of Prometheus itself that rules may use, and their labels.
PROMETHEUS_SERIES = {"up": set(), "scrape_duration_seconds": set(),
                     "scrape_samples_scraped": set()}

AGGREGATIONS = {"sum", "min", "max", "avg", "count", "stddev", "stdvar", "group", "topk",
                "bottomk", "quantile", "count_values"}
# Functions whose result is a scalar, or that take no vector (vector(s): an empty label set).
SCALAR_FUNCTIONS = {"time", "pi", "scalar", "minute", "hour", "day_of_week", "day_of_month",
                    "days_in_month", "month", "year"}
SET_OPERATORS = {"and", "or", "unless"}
PRECEDENCE = [  # lowest first
    {"or"},
    {"and", "unless"},
    {"==", "!=", "<=", "<", ">=", ">"},
    {"+", "-"},
    {"*", "/", "%", "atan2"},
    {"^"},
]

_TOKEN = re.compile(r"""
    (?P<space>\s+|\#[^\n]*)
  | (?P<duration>(?:[0-9]+(?:ms|[smhdwy]))+)(?![A-Za-z0-9_:])
  | (?P<number>0x[0-9a-fA-F]+|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)
  | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<op>==|!=|>=|<=|=~|!~|[-+*/%^<>=(),{}\[\]@:])
""", re.X)


class ParseError(Exception):
    pass


def tokenize(expr):
    tokens, pos = [], 0
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m:
            raise ParseError(f"unexpected {expr[pos:pos + 10]!r} at {pos}")
        pos = m.end()
        kind = m.lastgroup
        if kind != "space":
            tokens.append((kind, m.group(kind)))
    tokens.append(("end", ""))
    return tokens


def _unquote(s):
    if s[0] == "`":
        return s[1:-1]
    return re.sub(r"\\(.)", r"\1", s[1:-1])


class Parser:
    """Recursive descent over the token list; nodes are tuples (kind, ...)."""

    def __init__(self, expr):
        self.tokens = tokenize(expr)
        self.i = 0

    def peek(self, k=0):
        return self.tokens[self.i + k]

    def take(self, value=None):
        kind, text = self.tokens[self.i]
        if value is not None and text != value:
            raise ParseError(f"expected {value!r}, found {text!r}")
        self.i += 1
        return kind, text

    def parse(self):
        node = self.expr(0)
        if self.peek()[0] != "end":
            raise ParseError(f"unexpected {self.peek()[1]!r}")
        return node

    def label_list(self):
        self.take("(")
        labels = []
        while self.peek()[1] != ")":
            kind, text = self.take()
            if kind != "ident":
                raise ParseError(f"expected a label name, found {text!r}")
            labels.append(text)
            if self.peek()[1] == ",":
                self.take(",")
        self.take(")")
        return labels

    def expr(self, level):
        if level == len(PRECEDENCE):
            return self.unary()
        lhs = self.expr(level + 1)
        while self.peek()[1] in PRECEDENCE[level] and self.peek()[0] in ("op", "ident"):
            op = self.take()[1]
            mods = {"bool": False, "on": None, "ignoring": None, "group": None, "extra": []}
            if self.peek()[1] == "bool":
                self.take()
                mods["bool"] = True
            if self.peek()[1] in ("on", "ignoring"):
                how = self.take()[1]
                mods[how] = self.label_list()
            if self.peek()[1] in ("group_left", "group_right"):
                mods["group"] = self.take()[1]
                if self.peek()[1] == "(":
                    mods["extra"] = self.label_list()
            # ^ is right-associative; everything else left.
            rhs = self.expr(level) if op == "^" else self.expr(level + 1)
            lhs = ("bin", op, lhs, rhs, mods)
        return lhs

    def unary(self):
        if self.peek()[1] in ("-", "+"):
            self.take()
            return ("neg", self.unary())
        return self.postfix(self.primary())

    def postfix(self, node):
        while True:
            if self.peek()[1] == "[":
                self.take("[")
                while self.peek()[1] != "]":
                    if self.peek()[0] == "end":
                        raise ParseError("unclosed [")
                    self.take()
                self.take("]")
                node = ("range", node)
            elif self.peek()[1] == "offset":
                self.take()
                if self.peek()[1] == "-":
                    self.take()
                if self.take()[0] != "duration":
                    raise ParseError("offset needs a duration")
            elif self.peek()[1] == "@":
                self.take()
                self.take()
                if self.peek()[1] == "(":
                    self.take("(")
                    self.take(")")
            else:
                return node

    def primary(self):
        kind, text = self.peek()
        if kind == "number" or (kind == "ident" and text.lower() in ("inf", "nan")):
            self.take()
            return ("num",)
        if kind == "string":
            self.take()
            return ("str", _unquote(text))
        if text == "(":
            self.take("(")
            node = self.expr(0)
            self.take(")")
            return node
        if text == "{":
            return ("sel", None, self.matchers())
        if kind != "ident":
            raise ParseError(f"unexpected {text!r}")
        self.take()
        if text in AGGREGATIONS and self.peek()[1] in ("(", "by", "without"):
            return self.aggregation(text)
        if self.peek()[1] == "(":
            return ("call", text, self.args())
        matchers = self.matchers() if self.peek()[1] == "{" else []
        return ("sel", text, matchers)

    def args(self):
        self.take("(")
        args = []
        while self.peek()[1] != ")":
            args.append(self.expr(0))
            if self.peek()[1] == ",":
                self.take(",")
        self.take(")")
        return args

    def aggregation(self, name):
        grouping = None
        if self.peek()[1] in ("by", "without"):
            grouping = (self.take()[1], self.label_list())
        args = self.args()
        if grouping is None and self.peek()[1] in ("by", "without"):
            grouping = (self.take()[1], self.label_list())
        return ("agg", name, grouping, args)

    def matchers(self):
        self.take("{")
        out = []
        while self.peek()[1] != "}":
            kind, label = self.take()
            if kind not in ("ident", "string"):
                raise ParseError(f"expected a label name, found {label!r}")
            op = self.take()[1]
            if op not in ("=", "!=", "=~", "!~"):
                raise ParseError(f"bad matcher operator {op!r}")
            kind, value = self.take()
            if kind != "string":
                raise ParseError(f"matcher value {value!r} is not a string")
            out.append((label, op, _unquote(value)))
            if self.peek()[1] == ",":
                self.take(",")
        self.take("}")
        return out


def metric_labels(name, catalog):
    """Labels a series of `name` can carry, or None when the metric is unknown."""
    if name in PROMETHEUS_SERIES:
        return set(PROMETHEUS_SERIES[name]) | TARGET_LABELS
    base, extra = name, set()
    if name not in catalog:
        for suffix, labels in (("_bucket", {"le"}), ("_sum", set()), ("_count", set())):
            stem = name[: -len(suffix)]
            if name.endswith(suffix) and catalog.get(stem, {}).get("type") == "histogram":
                base, extra = stem, labels
                break
        else:
            return None
    return set(catalog[base]["labels"]) | TARGET_LABELS | extra


def known_values(name, catalog):
    base = name
    for suffix in ("_bucket", "_sum", "_count"):
        if name not in catalog and name.endswith(suffix):
            base = name[: -len(suffix)]
    return (catalog.get(base) or {}).get("label_values", {})


def _plain_alternatives(regex):
    """The literal alternatives of `a|b|c`; pieces with regex syntax are skipped."""
    return [p for p in regex.split("|") if re.fullmatch(r"[\w.-]+", p) and "." not in p]


class Checker:
    def __init__(self, catalog):
        self.catalog = catalog
        self.problems = []

    def bad(self, what):
        if what not in self.problems:
            self.problems.append(what)

    def labels(self, node):
        """('scalar'|'string'|'vector', set of labels or None for unknown)."""
        kind = node[0]
        if kind == "num":
            return "scalar", set()
        if kind == "str":
            return "string", set()
        if kind == "neg":
            return self.labels(node[1])
        if kind == "range":
            return self.labels(node[1])
        if kind == "sel":
            return "vector", self.selector(node[1], node[2])
        if kind == "call":
            return self.call(node[1], node[2])
        if kind == "agg":
            return self.aggregation(node[1], node[2], node[3])
        if kind == "bin":
            return self.binary(*node[1:])
        raise AssertionError(kind)

    def selector(self, name, matchers):
        if name is None:
            return None
        labels = metric_labels(name, self.catalog)
        values = known_values(name, self.catalog)
        for label, op, value in matchers:
            if label == "__name__":
                continue
            if labels is not None and label not in labels:
                self.bad(f"{name} has no label {label!r} (catalog: "
                         f"{', '.join(sorted(labels - TARGET_LABELS)) or 'none'})")
                continue
            if label not in values or value == "":
                continue
            literals = [value] if op in ("=", "!=") else _plain_alternatives(value)
            for v in literals:
                if v not in values[label]:
                    self.bad(f"{name}{{{label}{op}\"{value}\"}}: {v!r} is not a value of "
                             f"{label} ({'|'.join(values[label])})")
        return labels

    def call(self, name, args):
        typed = [self.labels(a) for a in args]
        vectors = [labels for t, labels in typed if t == "vector"]
        if name in SCALAR_FUNCTIONS:
            return "scalar", set()
        if name == "vector":
            return "vector", set()
        if name == "histogram_quantile":
            inner = vectors[0] if vectors else None
            if inner is not None and "le" not in inner:
                self.bad("histogram_quantile over series without an 'le' label "
                         "(aggregate by (..., le))")
            return "vector", None if inner is None else inner - {"le"}
        if name in ("label_replace", "label_join"):
            inner = vectors[0] if vectors else None
            dst = args[1][1] if len(args) > 1 and args[1][0] == "str" else None
            return "vector", None if inner is None or dst is None else inner | {dst}
        if name in ("absent", "absent_over_time"):
            return "vector", None
        if not vectors:
            return "scalar", set()
        return "vector", vectors[0]

    def aggregation(self, name, grouping, args):
        typed = [self.labels(a) for a in args]
        vectors = [labels for t, labels in typed if t == "vector"]
        inner = vectors[-1] if vectors else set()
        if grouping:
            how, labels = grouping
            if how == "by" and inner is not None:
                for label in labels:
                    if label not in inner:
                        self.bad(f"{name} by ({', '.join(labels)}): the series inside carry no "
                                 f"label {label!r} (they have: "
                                 f"{', '.join(sorted(inner)) or 'none'})")
        if name in ("topk", "bottomk"):
            return "vector", inner
        if name == "count_values":
            extra = {args[0][1]} if args and args[0][0] == "str" else set()
            base = set(grouping[1]) if grouping and grouping[0] == "by" else set()
            return "vector", base | extra
        if not grouping:
            return "vector", set()
        how, labels = grouping
        if how == "by":
            return "vector", set(labels)
        return "vector", None if inner is None else inner - set(labels)

    def binary(self, op, lhs, rhs, mods):
        lt, ll = self.labels(lhs)
        rt, rl = self.labels(rhs)
        if lt != "vector" and rt != "vector":
            return "scalar", set()
        if lt != "vector":
            return "vector", rl
        if rt != "vector":
            return "vector", ll
        matching = mods["on"] if mods["on"] is not None else mods["ignoring"]
        if mods["on"] is not None:
            for side, labels in (("left", ll), ("right", rl)):
                if labels is None:
                    continue
                missing = [m for m in mods["on"] if m not in labels]
                if missing:
                    self.bad(f"on ({', '.join(mods['on'])}): the {side} side of {op!r} carries "
                             f"no {', '.join(repr(m) for m in missing)}")
        if op == "or":
            return "vector", None if ll is None or rl is None else ll | rl
        if op in SET_OPERATORS:
            return "vector", ll
        if mods["group"] == "group_left":
            return "vector", None if ll is None else ll | set(mods["extra"])
        if mods["group"] == "group_right":
            return "vector", None if rl is None else rl | set(mods["extra"])
        if mods["on"] is not None:
            return "vector", set(mods["on"])
        if matching and ll is not None:
            return "vector", ll - set(matching)
        return "vector", ll


def check(expr, catalog):
    """(problems, labels the result's series can carry or None when unknown)."""
    try:
        node = Parser(expr).parse()
    except ParseError as e:
        return [f"cannot parse: {e}"], None
    checker = Checker(catalog)
    _, labels = checker.labels(node)
    return checker.problems, labels


def series_problems(series, catalog):
    """Problems of one promtool input series `name{a="b",...}` against the catalog."""
    try:
        node = Parser(series).parse()
    except ParseError as e:
        return [f"cannot parse: {e}"]
    if node[0] != "sel":
        return ["not a series selector"]
    name, matchers = node[1], node[2]
    if metric_labels(name, catalog) is None:
        return [f"{name} is not in the catalog"]
    checker = Checker(catalog)
    checker.selector(name, matchers)
    return checker.problems
