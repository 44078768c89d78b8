"""What a guardrail finds in a text: pure, on maintained libraries.

A policy's detectors are compiled once per config snapshot into one regex, an alternation of
named groups (`Detector`); a match is only a candidate, kept when its check holds: payment
cards by their Luhn digit, IBANs by mod 97, national ids by their own checksums
(python-stdnum), phone numbers by libphonenumber's rules (`phonenumbers`), IP addresses by
`ipaddress`. So a checksum-valid number is found and a checksum-invalid one is not, and the
costly checks run only on the few candidates the regex lets through.
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
_EMAIL = r"(?<![\w.+-])[A-Za-z0-9._%+-]{1,64}@(?:[A-Za-z0-9-]{1,63}\.)+[A-Za-z]{2,24}\b"
_IBAN = r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}\b"
_IP = (r"(?<![\w.])(?:\d{1,3}\.){3}\d{1,3}(?!\w|\.\d)"
       r"|(?<![\w:])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:])")
# Digits as people write them: cards, phone numbers, ids; told apart by their checks.
_NUMBER = r"(?<![\w+])\+?\(?\d[\d \-().]{5,28}\d(?!\w)"
_LETTERED_ID = r"\b\d{8}-?[A-Z]\b|\b\d{6}[-+A]\d{3}[0-9A-Y]\b"  # Spain's DNI, Finland's HETU

_IDS: tuple[Callable[[str], bool], ...] = (
    ssn.is_valid, bsn.is_valid, pesel.is_valid, cpf.is_valid, aadhaar.is_valid)
_LETTERED_IDS: tuple[Callable[[str], bool], ...] = (dni.is_valid, hetu.is_valid)


class Found(NamedTuple):
    """One value found: where it is in the text, and its category."""

    start: int
    end: int
    category: str


class Detector:
    """One policy's detectors as one compiled regex, and the checks behind its groups."""

    __slots__ = ("_categories", "_numbers", "_own", "_pattern", "_region")

    def __init__(self, detect: Sequence[str], patterns: Mapping[str, str] = {},
                 words: Sequence[str] = (), region: str | None = None) -> None:
        groups: list[str] = []
        if "secrets" in detect:
            groups.append(f"(?P<secret>{'|'.join(_SECRETS)})")
        if "email" in detect:
            groups.append(f"(?P<email>{_EMAIL})")
        if "iban" in detect:
            groups.append(f"(?P<iban>{_IBAN})")
        if "ip" in detect:
            groups.append(f"(?P<ip>{_IP})")
        if "national_id" in detect:
            groups.append(f"(?P<lettered>{_LETTERED_ID})")
        self._numbers = tuple(kind for kind in ("card", "national_id", "phone") if kind in detect)
        if self._numbers:
            groups.append(f"(?P<number>{_NUMBER})")
        if words:
            alternatives = "|".join(re.escape(w.strip()) for w in
                                    sorted(words, key=len, reverse=True))
            groups.append(rf"(?P<word>(?i:\b(?:{alternatives})\b))")
        # Every built-in value starts after a character that is no word's (the text is read
        # with a space before it): a regex that starts by consuming that character lets the
        # regex engine skip from one such character to the next, instead of trying each
        # alternative at every letter of every word.
        self._pattern = re.compile(rf"\W(?:{'|'.join(groups)})") if groups else None
        self._own = re.compile("|".join(f"(?P<p{at}>{pattern})" for at, pattern
                                        in enumerate(patterns.values()))) if patterns else None
        self._categories = {f"p{at}": category for at, category in enumerate(patterns)}
        self._region = region

    def find(self, text: str) -> list[Found]:
        """Every value of `text` this detector finds, in order, none overlapping."""
        found = []
        if self._pattern is not None:
            for match in self._pattern.finditer(" " + text):
                group = match.lastgroup
                if group is not None and (category := self._check(group, match.group(group))):
                    found.append(Found(match.start(), match.end() - 1, category))
        if self._own is not None:
            own = [Found(match.start(), match.end(), self._categories[match.lastgroup])
                   for match in self._own.finditer(text)
                   if match.lastgroup is not None and match.end() > match.start()]
            found = _apart(sorted(found + own)) if found else own
        return found

    def _check(self, group: str, value: str) -> str | None:
        """The category of a candidate its check holds for, else None."""
        if group == "secret":
            return SECRET
        if group == "email":
            return EMAIL
        if group == "iban":
            return IBAN if iban.is_valid(value) else None
        if group == "ip":
            return IP if _is_ip(value) else None
        if group == "lettered":
            return NATIONAL_ID if any(valid(value) for valid in _LETTERED_IDS) else None
        if group == "number":
            return self._number(value)
        return WORD

    def _number(self, value: str) -> str | None:
        digits = re.sub(r"\D", "", value)
        for kind in self._numbers:
            if kind == "card" and 13 <= len(digits) <= 19 and luhn.is_valid(digits) \
                    and re.fullmatch(r"[\d -]+", value):
                return CARD
            if kind == "national_id" and any(valid(value) for valid in _IDS):
                return NATIONAL_ID
            if kind == "phone" and _is_phone(value, self._region):
                return PHONE
        return None


def _apart(found: list[Found]) -> list[Found]:
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
