"""Chat corpus: instruction → response pairs answered by real reference text that ships with Python.

Sources, all read offline:

* docstrings of the standard library's public functions, methods, classes and
  modules (parsed from source by :mod:`lit_domino.data.corpora.code`), and of a
  few C-implemented modules and the built-in types (read at runtime);
* the Python language reference topics in :mod:`pydoc_data.topics`, cut into
  their titled sections.

Each source gives one example: a single question answered by the first
paragraphs of its text, or (for about a third of them) an MT-Bench-shaped
two-turn conversation whose follow-up ("Tell me more.", "Give an example.",
"Now explain it in one sentence.") is answered from the same text. Wording and
turn shape are chosen by a stable hash of the source, so they never change
between runs. Splits follow a stable hash of the module name (the same rule as
the code corpus) or of the reference topic.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re

from pydoc_data.topics import topics

from lit_domino.data.corpora import Example, turns_to_messages, dedup_split, split_of, stable_hash
from lit_domino.data.corpora.code import stdlib_defs

# An answer turn holds whole paragraphs up to this many characters (at least
# one paragraph, cut at a sentence when a single paragraph is longer): long
# enough to carry real explanations, short enough for a 256-token context.
MAX_ANSWER_CHARS = 1200
# Texts shorter than this ("Return self.", "Deprecated.") make useless answers.
MIN_TEXT_CHARS = 40
# Percent of sources that become two-turn conversations when their text allows one.
MULTI_TURN_PERCENT = 35

# Most user turns a long reference text (a language-reference section, a module
# docstring) is walked through with "Tell me more." turns.
MAX_USER_TURNS = 4

# C-implemented modules whose functions and types are documented only at runtime
# (there is no Python source to parse), mapped to the public name they are used
# under. Only modules CPython always builds on every platform, so the corpus is
# the same on every machine with the same CPython version.
RUNTIME_MODULES = {
    "builtins": "builtins", "math": "math", "cmath": "cmath", "itertools": "itertools",
    "operator": "operator", "gc": "gc", "binascii": "binascii", "array": "array",
    "unicodedata": "unicodedata", "_io": "io", "_decimal": "decimal", "_datetime": "datetime",
    "_collections": "collections", "_struct": "struct", "_pickle": "pickle", "_csv": "csv",
    "_heapq": "heapq", "_bisect": "bisect", "_functools": "functools", "_json": "json",
    "_random": "random", "_contextvars": "contextvars", "_queue": "queue",
}

OBJECT_QUESTIONS = (
    "Explain what `{name}` does.",
    "What does `{name}` do?",
    "Describe the purpose of `{name}`.",
    "I'm reading some Python code that uses `{name}`. What is it for?",
    "Give me a short description of `{name}`.",
    "Can you tell me what `{name}` is used for?",
    "In the Python standard library, what is `{name}`?",
    "How would you summarise `{name}`?",
    "What is the job of the {kind} `{name}`?",
    "Document the behaviour of the {kind} `{name}`.",
)
MODULE_QUESTIONS = (
    "Summarise the module `{name}`.",
    "What is the Python module `{name}` for?",
    "Give me an overview of the `{name}` module.",
    "What does the standard library module `{name}` provide?",
    "Describe the `{name}` module in a few sentences.",
    "I'm about to import `{name}`. What does it contain?",
    "Explain what the `{name}` module is used for.",
    "Tell me about Python's `{name}` module.",
)
TOPIC_QUESTIONS = (
    "What does the Python language reference say about {name}?",
    "Explain {name} in Python.",
    "How does {name} work in Python?",
    "I'm learning Python. Can you describe {name}?",
    "Give me an overview of {name} in Python.",
    "What should I know about {name} in Python?",
    "Describe {name} as the Python language reference defines it.",
    "Teach me about {name} in Python.",
)
FOLLOW_UPS = {
    "more": ("Tell me more.", "Can you go into more detail?", "What else should I know about it?", "Please continue."),
    "example": ("Give an example.", "Can you show an example?", "Show me how it is used."),
    "sentence": ("Now explain it in one sentence.", "Summarise that in one sentence.", "Give me the one-line version."),
    "signature": ("How do I call it?", "What arguments does it take?", "What is its signature?"),
}

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'`(])")
_UNDERLINE = re.compile(r"^([*=\-~^\"'+#])\1{2,}$")


def paragraphs(text: str) -> list[str]:
    # keep leading indentation (code and grammar blocks), drop trailing blanks
    return [p.rstrip().lstrip("\n") for p in re.split(r"\n\s*\n", text.strip()) if p.strip()]


def first_sentence(text: str) -> str:
    return _SENTENCE_END.split(" ".join(text.split()), maxsplit=1)[0]


def take_chunk(paras: list[str], limit: int = MAX_ANSWER_CHARS) -> tuple[str, list[str]]:
    """Leading paragraphs up to ``limit`` characters (at least one), and the paragraphs left over."""
    if not paras:
        return "", []
    first = paras[0]
    if len(first) > limit:  # one huge paragraph: keep whole sentences that fit
        flat = " ".join(first.split())
        sentences = _SENTENCE_END.split(flat)
        kept = sentences[0]
        for s in sentences[1:]:
            if len(kept) + 1 + len(s) > limit:
                break
            kept += " " + s
        return kept, paras[1:]
    out, used = [first], len(first)
    for p in paras[1:]:
        if used + 2 + len(p) > limit:
            break
        out.append(p)
        used += 2 + len(p)
    return "\n\n".join(out), paras[len(out) :]


def doctest_block(text: str) -> str | None:
    """The first interactive example (``>>>`` lines and their output) in ``text``, dedented."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith(">>> "):
            indent = len(line) - len(line.lstrip())
            block = []
            for follow in lines[i:]:
                if not follow.strip():
                    break
                block.append(follow[indent:] if follow[:indent].isspace() or not indent else follow.strip())
            example = "\n".join(block)
            return example if len(example) <= MAX_ANSWER_CHARS else None
    return None


def conversation(uid: str, question: str, text: str, signature: str = "", walk: bool = False) -> Example | None:
    """One example from a question and its source text.

    ``walk``: a long reference text, explained chunk by chunk over up to
    MAX_USER_TURNS turns. Otherwise single-turn, or for ~MULTI_TURN_PERCENT of
    uids an MT-Bench-shaped second turn answered from the same text (more
    detail, an example, a one-sentence summary, or the call signature).
    """
    answer, rest = take_chunk(paragraphs(text))
    if len(answer) < MIN_TEXT_CHARS:
        return None
    turns = [question, answer]
    h = stable_hash(uid)
    if walk:
        while rest and len(turns) < 2 * MAX_USER_TURNS:
            more, rest = take_chunk(rest)
            phrasings = FOLLOW_UPS["more"]
            turns += [phrasings[(h + len(turns)) % len(phrasings)], more]
        return Example("chat", turns_to_messages(*turns), uid)
    if h % 100 < MULTI_TURN_PERCENT:
        options: dict[str, str] = {}
        more, _ = take_chunk(rest)
        if len(more) >= MIN_TEXT_CHARS:
            options["more"] = more
        example = doctest_block("\n\n".join(rest))
        if example:
            options["example"] = "For example:\n\n" + example
        sentence = first_sentence(answer)
        if MIN_TEXT_CHARS // 2 <= len(sentence) < len(" ".join(answer.split())):
            options["sentence"] = sentence
        if signature:
            options["signature"] = f"Its signature is:\n\n```python\n{signature}\n```"
        if options:
            kind = sorted(options)[(h // 100) % len(options)]
            phrasings = FOLLOW_UPS[kind]
            turns += [phrasings[(h // 10_000) % len(phrasings)], options[kind]]
    return Example("chat", turns_to_messages(*turns), uid)


def _pick(phrasings: tuple[str, ...], uid: str, **fields) -> str:
    return phrasings[(stable_hash("q:" + uid)) % len(phrasings)].format(**fields)


def _stdlib_sources():
    """(split key, uid, question, text, signature, walk) for every public documented definition parsed from source."""
    for d in stdlib_defs():
        if not d.public or len(d.docstring) < MIN_TEXT_CHARS:
            continue
        uid = f"chat/{d.kind}/{d.name}"
        if d.kind == "module":
            yield d.module, uid, _pick(MODULE_QUESTIONS, uid, name=d.name), d.docstring, "", True
        else:
            question = _pick(OBJECT_QUESTIONS, uid, name=d.name, kind=d.kind)
            yield d.module, uid, question, d.docstring, d.signature, False


def _runtime_signature(name: str, obj) -> str:
    try:
        return f"{name}{inspect.signature(obj)}"
    except (TypeError, ValueError):  # many C callables carry no signature metadata
        return ""


def _runtime_sources():
    """Docstrings of the C-implemented functions, types and their methods in RUNTIME_MODULES."""
    for modname, public in RUNTIME_MODULES.items():
        module = importlib.import_module(modname)
        for attr in sorted(vars(module)):
            obj = vars(module)[attr]
            if attr.startswith("_"):
                continue
            if inspect.isbuiltin(obj):
                members = [(attr, "function", obj)]
            elif isinstance(obj, type) and obj.__module__ in (modname, public):
                members = [(attr, "class", obj)]
                for mname in sorted(vars(obj)):
                    member = vars(obj)[mname]
                    if not mname.startswith("_") and inspect.ismethoddescriptor(member):
                        members.append((f"{attr}.{mname}", "method", member))
            else:
                continue
            # builtins read naturally without a prefix (`str.split`); split them per name,
            # since one key for all of them would put every builtin on the same side
            key = f"builtins.{attr}" if public == "builtins" else public
            for qualname, kind, target in members:
                doc = inspect.getdoc(target)
                if not doc or len(doc) < MIN_TEXT_CHARS:
                    continue
                shown = qualname if public == "builtins" else f"{public}.{qualname}"
                uid = f"chat/{kind}/{public}.{qualname}"
                question = _pick(OBJECT_QUESTIONS, uid, name=shown, kind=kind)
                signature = _runtime_signature(qualname.rsplit(".", 1)[-1], target) if kind != "class" else ""
                yield key, uid, question, doc, signature, False


def _title(title: str) -> str:
    """'The "for" statement' reads mid-sentence as 'the "for" statement'."""
    return "t" + title[1:] if title.startswith("The ") else title


def topic_sections() -> list[tuple[str, str, str]]:
    """(topic key, section title, section text) of the language reference topics shipped with CPython."""
    out = []
    for key in sorted(topics):
        lines = topics[key].splitlines()
        heads = [
            i for i in range(len(lines) - 1)
            if lines[i].strip() and _UNDERLINE.match(lines[i + 1].strip()) and len(lines[i + 1].strip()) >= len(lines[i].strip())
        ]
        if not heads:
            continue
        top = _title(lines[heads[0]].strip())
        for j, start in enumerate(heads):
            end = heads[j + 1] if j + 1 < len(heads) else len(lines)
            title = _title(lines[start].strip())
            if j:
                title = f"{top}: {title}"
            out.append((key, title, "\n".join(lines[start + 2 : end]).strip()))
    return out


def _topic_sources():
    for key, title, text in topic_sections():
        uid = f"chat/topic/{key}/{title}"
        yield f"topic:{key}", uid, _pick(TOPIC_QUESTIONS, uid, name=title), text, "", True


@functools.lru_cache(maxsize=1)
def _pools() -> dict[str, tuple[Example, ...]]:
    splits: dict[str, list[Example]] = {"train": [], "eval": []}
    seen: set[str] = set()
    # Parsed sources first: where a pure-Python and a C version of a name both
    # exist (datetime, decimal, ...), the first one seen keeps the uid.
    for sources in (_stdlib_sources(), _runtime_sources(), _topic_sources()):
        for key, uid, question, text, signature, walk in sources:
            if uid in seen:
                continue
            seen.add(uid)
            ex = conversation(uid, question, text, signature, walk)
            if ex is not None:
                splits[split_of(key)].append(ex)
    train, eval_ = dedup_split(splits["train"], splits["eval"])
    return {"train": tuple(train), "eval": tuple(eval_)}


def pool(split: str) -> tuple[Example, ...]:
    """All chat examples of ``split``, in source order."""
    return _pools()[split]
