"""Embedded corpora: determinism, disjoint splits, correct math, parseable code, well-formed chats."""

from __future__ import annotations

import ast
import random
import re

import pytest

from lit_domino.data.corpora import DOMAINS, Example, build_corpus, corpus_stats
from lit_domino.data.corpora import chat as chat_corpus
from lit_domino.data.corpora import code as code_corpus
from lit_domino.data.corpora import math as math_corpus

EQUATION = re.compile(r"(\d+) ([-+*/]) (\d+) = (\d+)")
FENCED = re.compile(r"```python\n(.*?)```", re.S)


def _apply(a: int, op: str, b: int) -> int | None:
    if op == "/":
        return a // b if b and a % b == 0 else None  # inexact division is a bug too
    return {"+": a + b, "-": a - b, "*": a * b}[op]


def check_solution(ex: Example) -> None:
    """Every ``a op b = c`` holds, every '=' belongs to one, and ``#### N`` equals the answer."""
    solution = ex.response
    *steps, final = solution.splitlines()
    assert 2 <= len(steps) <= 3, solution
    for line in steps:
        found = EQUATION.findall(line)
        assert found and len(found) == line.count("="), f"unparsed step {line!r}"
        for a, op, b, c in found:
            assert _apply(int(a), op, int(b)) == int(c), f"wrong arithmetic in {line!r}"
    assert final == f"#### {ex.answer}"
    assert 0 <= int(ex.answer) < 1000
    # the answer is the result of the last step
    assert EQUATION.findall(steps[-1])[-1][3] == ex.answer


def check_shape(ex: Example, domain: str) -> None:
    assert ex.domain == domain
    assert len(ex.messages) >= 2 and len(ex.messages) % 2 == 0
    for i, m in enumerate(ex.messages):
        assert m["role"] == ("user", "assistant")[i % 2]
        assert isinstance(m["content"], str) and m["content"].strip()


# ---- API -------------------------------------------------------------------------------------


def test_unknown_domain_or_split_names_the_choices():
    with pytest.raises(ValueError, match="math, code, chat"):
        build_corpus("poetry", "train")
    with pytest.raises(ValueError, match="train, eval"):
        build_corpus("math", "test")
    with pytest.raises(ValueError, match="positive"):
        build_corpus("math", "train", n=0)


@pytest.mark.parametrize("domain", DOMAINS)
def test_same_arguments_same_list(domain):
    a = build_corpus(domain, "eval", n=50, seed=3)
    b = build_corpus(domain, "eval", n=50, seed=3)
    assert a == b
    # seed reorders the pool but never moves an example to the other split
    full0, full1 = build_corpus(domain, "eval", seed=0), build_corpus(domain, "eval", seed=1)
    assert [e.uid for e in full0] != [e.uid for e in full1]
    assert {e.uid for e in full0} == {e.uid for e in full1}


@pytest.mark.parametrize("domain", DOMAINS)
def test_splits_never_overlap(domain):
    train = build_corpus(domain, "train", seed=0)
    other_seed = build_corpus(domain, "train", n=2000, seed=7)
    eval_ = build_corpus(domain, "eval", seed=0)
    assert train and eval_
    for tr in (train, other_seed):
        assert not {e.uid for e in tr} & {e.uid for e in eval_}
        assert not {e.prompt for e in tr} & {e.prompt for e in eval_}
    assert len({e.uid for e in train}) == len(train)
    assert len({e.prompt for e in train}) == len(train)


@pytest.mark.parametrize("domain", DOMAINS)
def test_examples_are_alternating_chats(domain):
    for split in ("train", "eval"):
        for ex in build_corpus(domain, split):
            check_shape(ex, domain)


def test_too_many_requested_from_a_fixed_pool():
    size = len(build_corpus("code", "eval"))
    with pytest.raises(ValueError, match=f"holds {size}"):
        build_corpus("code", "eval", n=size + 1)
    with pytest.raises(ValueError, match="holds 500"):
        build_corpus("math", "eval", n=501)


@pytest.mark.parametrize("domain", DOMAINS)
def test_corpus_stats_match_the_corpus(domain):
    stats = corpus_stats(domain, "eval")
    examples = build_corpus(domain, "eval")
    assert stats["examples"] == len(examples)
    assert stats["characters"] == sum(len(m["content"]) for e in examples for m in e.messages)
    assert stats["approx_tokens"] == stats["characters"] // 4


# ---- math ------------------------------------------------------------------------------------


def test_math_default_sizes_and_prefixes():
    train = build_corpus("math", "train")
    assert len(train) == math_corpus.DEFAULT_TRAIN_SIZE
    assert len(build_corpus("math", "eval")) == math_corpus.EVAL_SIZE
    # a shorter train corpus is a prefix of a longer one with the same seed
    assert build_corpus("math", "train", n=300) == train[:300]
    assert build_corpus("math", "train", n=300, seed=1) != train[:300]


@pytest.mark.parametrize("split", ["train", "eval"])
def test_math_solutions_are_correct(split):
    for ex in build_corpus("math", split):
        check_solution(ex)


def test_every_template_makes_correct_problems():
    assert len(math_corpus.TEMPLATES) >= 15
    draw = math_corpus.Draw(random.Random(0))
    for name, template in math_corpus.TEMPLATES.items():
        made = 0
        for _ in range(300):
            out = template(draw)
            if out is None:
                continue
            question, steps, answer, numbers = out
            check_solution(math_corpus._example(question, steps, answer))
            assert all(0 <= x < 1000 for x in numbers), name
            made += 1
        assert made > 100, f"template {name} rejects most draws"


def test_math_check_catches_a_wrong_step():
    ex = build_corpus("math", "eval", n=1)[0]
    a, op, b, c = EQUATION.findall(ex.response)[0]
    broken = ex.response.replace(f"{a} {op} {b} = {c}", f"{a} {op} {b} = {int(c) + 1}", 1)
    bad = Example("math", (ex.messages[0], {"role": "assistant", "content": broken}), ex.uid, ex.answer)
    with pytest.raises(AssertionError):
        check_solution(bad)


def test_math_eval_arithmetic_is_held_out():
    """Train never repeats an eval problem's template and numbers, only their wording."""
    eval_keys = math_corpus._eval_pool()[1]
    rng = random.Random("math-train-0")
    draw = math_corpus.Draw(rng)
    train_questions = {e.prompt for e in build_corpus("math", "train", n=2000)}
    rejected = leaked = 0
    for _ in range(3000):  # replay the start of the train stream: eval problems it draws must be dropped
        name = math_corpus._NAMES[rng.randrange(len(math_corpus._NAMES))]
        made = math_corpus.TEMPLATES[name](draw)
        if made and (name, made[3]) in eval_keys:
            rejected += 1
            leaked += made[0] in train_questions
    assert rejected > 0  # the stream does draw eval arithmetic, so the check is not vacuous
    assert leaked == 0


# ---- code ------------------------------------------------------------------------------------


def _code_parts(ex: Example) -> tuple[str, str]:
    (header,) = FENCED.findall(ex.prompt)
    (body,) = FENCED.findall(ex.response)
    return header, body


@pytest.mark.parametrize("split", ["train", "eval"])
def test_code_prompts_complete_to_valid_python(split):
    examples = build_corpus("code", split)
    assert len(examples) > (1000 if split == "train" else 100)
    for ex in examples:
        header, body = _code_parts(ex)
        tree = ast.parse(header + body)  # raises on a bad split
        (fn,) = tree.body
        assert isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
        assert ast.get_docstring(fn), ex.uid
        assert len(fn.body) >= 2, ex.uid  # a real body after the docstring
        assert (header + body).count("\n") <= code_corpus.MAX_LINES
        assert len(header + body) <= code_corpus.MAX_CHARS + 1


def test_code_splits_by_module():
    def modules(split):
        return {e.uid.split("/")[1] for e in build_corpus("code", split)}

    assert not modules("train") & modules("eval")
    skipped = {"test", "idlelib", "lib2to3", "tkinter"}
    assert not {m.split(".")[0] for m in modules("train") | modules("eval")} & skipped


def test_humaneval_has_164_problems_never_in_training():
    problems = code_corpus.humaneval_examples()
    assert len(problems) == 164
    assert len({p.uid for p in problems}) == 164
    assert problems[0].uid == "humaneval/HumanEval/0"
    for p in problems:
        header, body = _code_parts(p)
        ast.parse(header + body)
    train_prompts = {e.prompt for e in build_corpus("code", "train")}
    assert not train_prompts & {p.prompt for p in problems}


# ---- chat ------------------------------------------------------------------------------------


def test_chat_has_varied_single_and_multi_turn_examples():
    for split in ("train", "eval"):
        examples = build_corpus("chat", split)
        multi = [e for e in examples if len(e.messages) > 2]
        two_turn = [e for e in multi if len(e.messages) == 4]
        assert len(multi) > 0.1 * len(examples), split
        assert two_turn, split
    assert min(len(chat_corpus.OBJECT_QUESTIONS), len(chat_corpus.MODULE_QUESTIONS), len(chat_corpus.TOPIC_QUESTIONS)) >= 8
    train = build_corpus("chat", "train")
    templates = chat_corpus.OBJECT_QUESTIONS + chat_corpus.MODULE_QUESTIONS + chat_corpus.TOPIC_QUESTIONS
    used = {t for t in templates for e in train if e.prompt.startswith(t.split("{")[0]) and t.split("{")[0]}
    assert len(used) >= 8
    follow_ups = {e.messages[2]["content"] for e in train if len(e.messages) > 2}
    assert follow_ups <= {f for fs in chat_corpus.FOLLOW_UPS.values() for f in fs}
    assert len(follow_ups) >= 8


def test_chat_covers_its_three_sources():
    uids = [e.uid for e in build_corpus("chat", "train")]
    assert any(u.startswith("chat/topic/") for u in uids)  # language reference
    assert any(u.startswith("chat/module/") for u in uids)  # module docstrings
    assert any(u == "chat/method/builtins.str.split" or u.startswith("chat/function/json.") for u in uids)


def test_chat_answers_come_from_the_source_text():
    docs = {
        f"chat/{d.kind}/{d.name}": d.docstring
        for d in code_corpus.stdlib_defs()
        if len(d.docstring) >= chat_corpus.MIN_TEXT_CHARS  # shorter ones may be answered by the C twin's docstring
    }
    checked = 0
    for ex in build_corpus("chat", "train"):
        if ex.uid in docs:
            first = ex.messages[1]["content"]
            assert " ".join(first.split()[:5]) in " ".join(docs[ex.uid].split()), ex.uid
            checked += 1
    assert checked > 1000


def test_chunking_keeps_whole_paragraphs():
    paras = ["a" * 500, "b" * 500, "c" * 500]
    chunk, rest = chat_corpus.take_chunk(paras, limit=1200)
    assert chunk == "a" * 500 + "\n\n" + "b" * 500 and rest == ["c" * 500]
    long_one = ["First sentence here. " * 100]
    chunk, rest = chat_corpus.take_chunk(long_one, limit=100)
    assert chunk.endswith(".") and len(chunk) <= 100 and rest == []
