"""Bad input, as the user scripts (scripts/plan.py, sweep.py, report.py) refuse it: one line on stderr,
`<script>.py: error: <setting> <value>: <what is wrong and the fix>`, exit code 2, before any work starts and with
nothing written (no folder made, no file replaced).

    p = Parser(prog="plan.py", description=first_sentences(__doc__))
    p.add_argument("--steps", type=at_least(1), ...)            # "--steps 0: must be >= 1" from argparse itself
    if why := unwritable(out): ...                                 # a folder it can make or write, checked, not made
    link = load_link("--link", a.link)                             # ConfigError in one line, never a traceback
"""

import argparse
import math
import os
import re
import sys
import tempfile
from pathlib import Path

from flux_cp.config import ConfigError
from flux_cp.runs.failures import EXIT_CONFIG


class Parser(argparse.ArgumentParser):
    """argparse with its errors in one line of the scripts' form and exit code 2 (argparse prints the usage too)."""

    def error(self, message):
        print(f"{self.prog}: error: {reword(message)} (see --help)", file=sys.stderr)
        sys.exit(EXIT_CONFIG)


_INVALID = re.compile(r"argument (?P<flag>[^:]+): invalid (?P<kind>\w+) value: '(?P<value>.*)'$")
_CHOICE = re.compile(r"argument (?P<flag>[^:]+): invalid choice: '(?P<value>.*)' \(choose from (?P<choices>.*)\)$")
_OTHER = re.compile(r"argument (?P<flag>[^:]+): (?P<why>.*)$")
_KINDS = {"int": "an integer", "float": "a number"}


def reword(message: str) -> str:
    """argparse's message in the form `<setting> <value>: <what is wrong>`."""
    message = " ".join(message.split())
    if m := _INVALID.match(message):
        return f"{m['flag'].split('/')[0]} {m['value']}: expected {_KINDS.get(m['kind'], m['kind'])}"
    if m := _CHOICE.match(message):
        return f"{m['flag'].split('/')[0]} {m['value']}: choose one of {m['choices'].replace(chr(39), '')}"
    if m := _OTHER.match(message):
        flag, why = m["flag"].split("/")[0], m["why"]
        if why.startswith("expected "):  # expected one argument
            return f"{flag}: {why.replace('expected', 'expects')}, none given"
        if why.startswith("not allowed with argument "):
            return f"{flag}: not allowed with {why.removeprefix('not allowed with argument ')} (give one of them)"
        return f"{flag} {why}"  # a type below raised it: its text starts with the value
    if message.startswith("unrecognized arguments: "):
        return f"{message.removeprefix('unrecognized arguments: ')}: unknown option(s)"
    if message.startswith("the following arguments are required: "):
        return f"{message.removeprefix('the following arguments are required: ')}: required"
    return message


def at_least(low: int):
    """argparse type: an integer >= low."""
    def integer(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text}: expected an integer") from None
        if v < low:
            raise argparse.ArgumentTypeError(f"{text}: must be >= {low}")
        return v

    return integer


def positive(unit: str = ""):
    """argparse type: a finite number > 0 (nan and inf refused)."""
    def number(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text}: expected a number") from None
        if not math.isfinite(v) or v <= 0:
            raise argparse.ArgumentTypeError(f"{text}: must be a number{f' of {unit}' if unit else ''} > 0")
        return v

    return number


def shown(value) -> str:
    """A value as the message shows it: '' where it is empty."""
    return str(value) if str(value) else "''"


def items(flag: str, text: str, choices=None) -> list[str]:
    """A comma-separated setting's items; empty ones refused, and (given choices) unknown ones."""
    parts = [x.strip() for x in text.split(",")]
    if not text.strip() or not all(parts):
        raise ConfigError(f"{flag} {shown(text)}: give comma-separated names, none empty")
    if choices is not None and (bad := [x for x in parts if x not in choices]):
        raise ConfigError(f"{flag} {text}: {', '.join(bad)} unknown (choose from {', '.join(choices)})")
    return parts


def unwritable(path: Path) -> str | None:
    """Why `path` cannot be (or become) a folder this process writes, or None; nothing is left behind (a probe
    folder is made and removed in the nearest folder that exists)."""
    p = Path(path)
    if p.exists():
        if not p.is_dir():
            return "a file is in the way (give a folder)"
        probe = p
    else:
        probe = p.parent
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        if not probe.is_dir():
            return f"{probe} is a file, not a folder (give a folder)"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".flux-cp-probe-", dir=probe))
    except OSError as e:
        return f"cannot create folders in {probe} ({e.strerror or e}): give a folder you can write"
    return None


def check_folder(flag: str, path: Path) -> None:
    if why := unwritable(path):
        raise ConfigError(f"{flag} {shown(path)}: {why}")


def load_link(flag: str, value: str):
    """A link profile (a configs/links name, a YAML file, or a {W} pattern of files), else a one-line ConfigError."""
    import yaml

    from flux_cp.predict import links

    names = ", ".join(sorted(p.stem for p in links.LINKS_DIR.glob("*.yaml")))
    fix = f"give a name in configs/links ({names}) or a profile's YAML file"
    p = Path(value)
    if not value.strip() or ("{W}" not in value and not p.exists()
                             and not (links.LINKS_DIR / f"{value}.yaml").is_file()):
        raise ConfigError(f"{flag} {shown(value)}: no such link profile ({fix})")
    if p.is_dir():
        raise ConfigError(f"{flag} {value}: a folder, not a link profile ({fix})")
    try:
        mapping = not p.is_file() or isinstance(yaml.safe_load(p.read_text()), dict)
        profile = links.load_any(value) if mapping else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, yaml.YAMLError) as e:
        why = (str(e).strip().splitlines() or [""])[0]
        raise ConfigError(f"{flag} {value}: not a link profile ({type(e).__name__}{': ' + why if why else ''}); "
                          f"{fix}") from None
    if not mapping:
        raise ConfigError(f"{flag} {value}: not a link profile (its YAML holds no mapping of link settings); {fix}")
    return profile


def first_sentences(doc: str) -> str:
    """A script's --help description: its docstring's first paragraph, whole sentences on one line."""
    return " ".join(doc.split("\n\n")[0].split())
