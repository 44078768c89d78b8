"""What a guardrail finds in a text: pure, on maintained libraries.

A policy's detectors are compiled once per config snapshot (`Detector`): a scan per kind of
value, each skipping a text that cannot hold one cheaply (an address is read out from each
`@`, a secret from each of its prefixes, numbers and IPv4 addresses from the runs of digits
one regex finds). A match is only a candidate, kept when its check holds: payment
cards by their Luhn digit, IBANs by mod 97, national ids by their own checksums
(python-stdnum), phone numbers by libphonenumber's rules (`phonenumbers`), IP addresses by
`ipaddress`. So a checksum-valid number is found and a checksum-invalid one is not, and the
costly checks run only on the few candidates the scans let through.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import phonenumbers
from stdnum import iban, luhn
from stdnum.br import cpf
from stdnum.es import dni
from stdnum.fi import hetu
from stdnum.in_ import aadhaar
from stdnum.nl import bsn
from stdnum.pl import pesel
from stdnum.us import ssn

# The placeholder categories of the built-in detectors (`[EMAIL_1]`).
EMAIL, PHONE, CARD, IBAN, IP, SECRET, NATIONAL_ID, WORD = (
    "EMAIL", "PHONE", "CARD", "IBAN", "IP", "SECRET", "NATIONAL_ID", "WORD")

_SECRETS = (
    # PEM private keys, the block when it is whole, its first line when it is not
    r"-----BEGIN[A-Z0-9 ]{0,40} PRIVATE KEY-----"
    r"(?:[\s\S]{0,16384}?-----END[A-Z0-9 ]{0,40} PRIVATE KEY-----)?",
    r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*",  # JWT
    r"(?<![A-Za-z0-9_-])sk-[A-Za-z0-9_-]{20,}",  # OpenAI, Anthropic (sk-ant-), gateways' own
    r"\b(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}\b",  # AWS access key ids
    r"\bgh[pousr]_[A-Za-z0-9]{36,255}\b|\bgithub_pat_[A-Za-z0-9_]{22,255}\b",  # GitHub
)
# What every secret starts with: a text holding none of these holds no secret.
_SECRET_STARTS = ("-----BEGIN", "eyJ", "sk-", "AKIA", "ASIA", "ABIA", "ACCA")
_GITHUB_STARTS = ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_")  # with a `_`
_SECRET = re.compile("|".join(_SECRETS))
# An e-mail address is read out from its `@`: the local part before, the domain after.
_LOCAL = re.compile(r"(?<![\w.+-])[A-Za-z0-9._%+-]{1,64}\Z")
_DOMAIN = re.compile(r"(?:[A-Za-z0-9-]{1,63}\.)+[A-Za-z]{2,24}\b")
_IBAN = re.compile(r"[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}\b")
_IP4 = re.compile(r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?!\w|\.\d)")
_IP6 = re.compile(r"(?<![\w:])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:])")
# Digits as people write them: cards, phone numbers, ids, IPv4 addresses; told apart by their
# checks. A run starts at a digit (so the regex engine skips the letters between), and takes
# the `+` and `(` before it.
_RUN = re.compile(r"\d[\d \-().]{5,28}\d(?!\w)")
_NON_DIGIT = re.compile(r"\D")
_LETTERED_ID = re.compile(r"\d{6}(?:\d\d-?[A-Z]|[-+A]\d{3}[0-9A-Y])\b")  # DNI, HETU

_IDS: tuple[Callable[[str], bool], ...] = (
    ssn.is_valid, bsn.is_valid, pesel.is_valid, cpf.is_valid, aadhaar.is_valid)
_LETTERED_IDS: tuple[Callable[[str], bool], ...] = (dni.is_valid, hetu.is_valid)


class Found(NamedTuple):
    """One value found: where it is in the text, and its category."""

    start: int
    end: int
    category: str


Scan = Callable[[str], list[Found]]


class Detector:
    """One policy's detectors: a scan per kind of value, each skipping what cannot hold one
    (no `@`, no secret's prefix, no digit run), and the checks behind their candidates."""

    __slots__ = ("_categories", "_numbers", "_own", "_region", "_scans", "_words")

    def __init__(self, detect: Sequence[str], patterns: Mapping[str, str] = {},
                 words: Sequence[str] = (), region: str | None = None) -> None:
        scans: list[Scan] = []
        if "secrets" in detect:
            scans.append(_secrets)
        if "email" in detect:
            scans.append(_emails)
        if "iban" in detect:
            scans.append(_ibans)
        if "ip" in detect:
            scans.append(_ip6s)
        if "national_id" in detect:
            scans.append(_lettered)
        self._numbers = tuple(kind for kind in ("card", "national_id", "phone") if kind in detect)
        if self._numbers or "ip" in detect:
            ip = "ip" in detect
            scans.append(lambda text: self._runs(text, ip))
        self._scans = tuple(scans)
        self._words = None
        if words:
            alternatives = "|".join(re.escape(w.strip()) for w in
                                    sorted(words, key=len, reverse=True))
            self._words = re.compile(rf"(?i:\b(?:{alternatives})\b)")
        self._own = re.compile("|".join(f"(?P<p{at}>{pattern})" for at, pattern
                                        in enumerate(patterns.values()))) if patterns else None
        self._categories = {f"p{at}": category for at, category in enumerate(patterns)}
        self._region = region

    def find(self, text: str) -> list[Found]:
        """Every value of `text` this detector finds, in order, none overlapping."""
        found = [item for scan in self._scans for item in scan(text)]
        if self._words is not None:
            found += [Found(m.start(), m.end(), WORD) for m in self._words.finditer(text)
                      if _after_non_word(text, m.start())]
        if self._own is not None:
            found += [Found(match.start(), match.end(), self._categories[match.lastgroup])
                      for match in self._own.finditer(text)
                      if match.lastgroup is not None and match.end() > match.start()]
        return apart(sorted(found)) if len(found) > 1 else found

    def _runs(self, text: str, ip: bool) -> list[Found]:
        """The IPv4 addresses and the checked numbers among `text`'s digit runs."""
        found = []
        for match in _RUN.finditer(text):
            start, end = match.span()
            if ip and "." in match[0] and (addresses := [Found(a.start(), a.end(), IP)
                                     for a in _IP4.finditer(text, start, end)
                                     if _is_ip(a[0])]):
                found += addresses
                continue
            if start and text[start - 1] == "(":
                start -= 1
            if start and text[start - 1] == "+":
                start -= 1
            if not self._numbers or (start and (text[start - 1] == "+"
                                                or not _after_non_word(text, start))):
                continue
            if category := self._number(text[start:end]):
                found.append(Found(start, end, category))
        return found

    def _number(self, value: str) -> str | None:
        digits = _NON_DIGIT.sub("", value)
        if len(digits) < 7:  # no card, id or phone number is shorter
            return None
        for kind in self._numbers:
            if kind == "card" and 13 <= len(digits) <= 19 and luhn.is_valid(digits) \
                    and re.fullmatch(r"[\d -]+", value):
                return CARD
            if kind == "national_id" and any(valid(value) for valid in _IDS):
                return NATIONAL_ID
            if kind == "phone" and _is_phone(value, self._region):
                return PHONE
        return None


def _after_non_word(text: str, at: int) -> bool:
    """Whether a value may start at `at`: the text's start, or after what is no word's."""
    return at == 0 or not (text[at - 1].isalnum() or text[at - 1] == "_")


def _secrets(text: str) -> list[Found]:
    """Secrets, looked for only where one of their prefixes is."""
    found = []
    for prefix in _SECRET_STARTS + _GITHUB_STARTS if "_" in text else _SECRET_STARTS:
        at = text.find(prefix)
        while at != -1:
            if (match := _SECRET.match(text, at)) and _after_non_word(text, at):
                found.append(Found(at, match.end(), SECRET))
            at = text.find(prefix, at + 1)
    return found


def _emails(text: str) -> list[Found]:
    """E-mail addresses, read out from each `@`."""
    found = []
    at = text.find("@")
    while at != -1:
        local = _LOCAL.search(text, max(0, at - 64), at)
        domain = _DOMAIN.match(text, at + 1)
        if local and domain and _after_non_word(text, local.start()):
            found.append(Found(local.start(), domain.end(), EMAIL))
        at = text.find("@", at + 1)
    return found


def _ibans(text: str) -> list[Found]:
    return [Found(m.start(), m.end(), IBAN) for m in _IBAN.finditer(text)
            if _after_non_word(text, m.start()) and iban.is_valid(m[0])]


def _ip6s(text: str) -> list[Found]:
    """IPv6 addresses: where there are two colons at least."""
    if text.count(":") < 2:
        return []
    return [Found(m.start(), m.end(), IP) for m in _IP6.finditer(text)
            if _after_non_word(text, m.start()) and _is_ip(m[0])]


def _lettered(text: str) -> list[Found]:
    """National ids with a letter: Spain's DNI, Finland's HETU."""
    return [Found(m.start(), m.end(), NATIONAL_ID) for m in _LETTERED_ID.finditer(text)
            if _after_non_word(text, m.start()) and any(valid(m[0]) for valid in _LETTERED_IDS)]


def apart(found: list[Found]) -> list[Found]:
    """`found`, in order, without a value that overlaps one before it."""
    kept: list[Found] = []
    for item in found:
        if not kept or item.start >= kept[-1].end:
            kept.append(item)
    return kept


def _is_ip(value: str) -> bool:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        return False
    return True


def _is_phone(value: str, region: str | None) -> bool:
    """A number libphonenumber holds valid: with its +country code, or as `region`'s."""
    if not value.startswith("+") and region is None:
        return False
    try:
        number = phonenumbers.parse(value, None if value.startswith("+") else region)
    except phonenumbers.NumberParseException:
        return False
    return phonenumbers.is_valid_number(number)
