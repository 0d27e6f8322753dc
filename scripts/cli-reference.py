#!/usr/bin/env python3
"""Writes docs/guide/cli.md from the clap definitions in crates/cli/src: every subcommand's
flags, their defaults and the first paragraph of their doc comments (what `--help` prints).

Run from the repository root: `python3 scripts/cli-reference.py > docs/guide/cli.md`.
Hidden flags (`hide = true`) are left out, as `--help` leaves them out.
"""
import re
import sys
from pathlib import Path

SRC = Path("crates/cli/src")  # entries may point into another crate: ../../ps/src/serve.rs
# Subcommand -> (file, struct), in the order `gradwire --help` lists them.
COMMANDS = [
    ("launch", "launch/mod.rs", "LaunchArgs"),
    ("check", "check.rs", "CheckArgs"),
    ("train", "train/args.rs", "TrainArgs"),
    ("report", "report.rs", "ReportArgs"),
    ("bench allreduce", "bench/allreduce.rs", "AllreduceBenchArgs"),
    ("bench codecs", "bench/codecs.rs", "CodecBenchArgs"),
    ("bench engine", "bench/engine.rs", "EngineBenchArgs"),
    ("bench ps", "bench/ps.rs", "PsBenchArgs"),
    ("ps serve", "../../ps/src/serve.rs", "ServeArgs"),
    ("simulate", "simulate/args.rs", "SimulateArgs"),
    ("calibrate", "calibrate.rs", "CalibrateArgs"),
]
FLATTEN = {
    "gradwire_job::Settings": ("../../job/src/settings.rs", "Settings"),
    "gradwire_job::ps::PsSettings": ("../../job/src/ps.rs", "PsSettings"),
    "gradwire_job::model_parallel::MpSettings": ("../../job/src/model_parallel.rs", "MpSettings"),
    "gradwire_job::elastic::ElasticSettings": ("../../job/src/elastic.rs", "ElasticSettings"),
}


def consts():
    """String constants used as `help = ...` (e.g. gradwire_run::join::TRANSPORT_HELP), from
    the CLI's sources and the run-rules library's."""
    out = {}
    for f in [*SRC.rglob("*.rs"), *Path("crates/run/src").rglob("*.rs")]:
        for m in re.finditer(r'pub const (\w+): &str =\s*"((?:[^"\\]|\\.)*)";', f.read_text(), re.S):
            out[m.group(1)] = re.sub(r"\\\n\s*", "", m.group(2))
    return out


def struct_body(text, name):
    m = re.search(r"pub struct " + name + r"\b[^{]*\{", text)
    if not m:
        sys.exit(f"struct {name} not found")
    depth, i = 1, m.end()
    while depth:
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        i += 1
    return text[m.end():i - 1]


def fields(body):
    """Yields (doc lines, attribute text, field name, type) per field."""
    doc, attrs, attr, depth = [], [], "", 0
    for line in body.splitlines():
        s = line.strip()
        if depth:
            attr += " " + s
            depth += s.count("[") - s.count("]")
            if depth <= 0:
                attrs.append(attr); attr, depth = "", 0
            continue
        if s.startswith("///"):
            doc.append(s[3:].strip())
        elif s.startswith("#["):
            attr, depth = s, s.count("[") - s.count("]")
            if depth <= 0:
                attrs.append(attr); attr, depth = "", 0
        else:
            m = re.match(r"(?:pub(?:\([^)]*\))?\s+)?(\w+):\s*(.+?),?$", s)
            if m:
                yield doc, " ".join(attrs), m.group(1), m.group(2)
                doc, attrs = [], []


def default(attrs):
    """The text of `default_value = "..."` or `default_value_t = EXPR` (EXPR up to the next
    comma outside parentheses)."""
    m = re.search(r"default_value(?:_t)?\s*=\s*", attrs)
    if not m:
        return ""
    rest = attrs[m.end():]
    if rest.startswith('"'):
        return rest[1:rest.index('"', 1)]
    depth, out = 0, ""
    for c in rest:
        if c in "([":
            depth += 1
        elif c in ")]":
            if depth == 0:
                break
            depth -= 1
        elif c == "," and depth == 0:
            break
        out += c
    return out.strip()


def first_paragraph(doc):
    para = []
    for d in doc:
        if not d:
            break
        para.append(d)
    return " ".join(para)


def rows(file, struct, helps):
    text = (SRC / file).read_text()
    for doc, attrs, name, ty in fields(struct_body(text, struct)):
        if "flatten" in attrs:
            f, s = FLATTEN[ty.strip()]
            yield from rows(f, s, helps)
            continue
        if "#[arg" not in attrs or "hide = true" in attrs:
            continue
        long = re.search(r'long\s*=\s*"([^"]+)"', attrs)
        flag = "--" + (long.group(1) if long else name.replace("_", "-")) if re.search(r"\blong\b", attrs) else name.upper()
        short = re.search(r"short\s*=\s*'(.)'", attrs)
        if short:
            flag = f"-{short.group(1)}, {flag}"
        elif re.search(r"\bshort\b", attrs):
            flag = f"-{name[0]}, {flag}"
        if "last = true" in attrs:
            flag = f"-- {name.upper()}..."
        dflt = default(attrs)
        text_ = first_paragraph(doc)
        h = re.search(r"help\s*=\s*(?:crate::)?(?:\w+::)*(\w+)", attrs)
        if h and h.group(1) in helps:
            text_ = helps[h.group(1)]
        yield flag, dflt, text_.replace("|", "\\|")


def main():
    helps = consts()
    print("# Command-line reference\n")
    print("Generated from the clap definitions in `crates/cli/src` by `scripts/cli-reference.py`")
    print("(the flags, defaults and first paragraph of each help text that `gradwire SUBCOMMAND")
    print("--help` prints). Every subcommand also takes `-v`/`-vv` (debug, trace logging;")
    print("`RUST_LOG` overrides).\n")
    for cmd, file, struct in COMMANDS:
        print(f"## `gradwire {cmd}`\n")
        print("| flag | default | meaning |")
        print("|---|---|---|")
        for flag, dflt, text in rows(file, struct, helps):
            print(f"| `{flag}` | {('`' + dflt + '`') if dflt else ''} | {text} |")
        print()


if __name__ == "__main__":
    main()
