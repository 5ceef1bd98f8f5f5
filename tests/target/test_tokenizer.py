from lit_domino.target.tokenizer import MASK, SPECIAL_TOKENS


def test_round_trip_text(corpus_tokenizer):
    text = "Tom has 12 + 7 = 19 apples.\ndef f(x):\n    return x  # ünïcode"
    ids = corpus_tokenizer(text, add_special_tokens=False)["input_ids"]
    assert corpus_tokenizer.decode(ids) == text


def test_digits_are_single_tokens(corpus_tokenizer):
    tokens = corpus_tokenizer.convert_ids_to_tokens(corpus_tokenizer("x 90210", add_special_tokens=False)["input_ids"])
    assert [t for t in tokens if t.isdigit()] == list("90210")


def test_special_tokens_and_chat_template(corpus_tokenizer):
    assert corpus_tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS) == list(range(len(SPECIAL_TOKENS)))
    assert corpus_tokenizer.mask_token == MASK
    msgs = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    text = corpus_tokenizer.apply_chat_template(msgs, tokenize=False, enable_thinking=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
    prompt = corpus_tokenizer.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>assistant\n")


def test_save_load_round_trip(corpus_tokenizer, tmp_path):
    from transformers import AutoTokenizer

    corpus_tokenizer.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    text = "<|im_start|>user\nWhat is 3 + 4?<|im_end|>\n"
    assert again(text)["input_ids"] == corpus_tokenizer(text)["input_ids"]
    assert again.mask_token_id == corpus_tokenizer.mask_token_id
    assert again.chat_template == corpus_tokenizer.chat_template


def test_render_matches_the_chat_template(corpus_tokenizer):
    from lit_domino.data.corpora import build_corpus
    from lit_domino.target.recipe import render

    for ex in build_corpus("chat", "train", 5):
        assert render(ex) == corpus_tokenizer.apply_chat_template(list(ex.messages), tokenize=False)
