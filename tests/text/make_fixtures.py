#!/usr/bin/env python3
"""Regenerates tests/text/fixtures/: small tokenizers trained here, and the ids the real libraries give.

    scripts/hf_venv.sh && .venv-hf/bin/python tests/text/make_fixtures.py

Nothing is downloaded. Byte-level BPE tokenizers (vocabulary 800) are trained with `tokenizers` on the
built-in corpus below, each with the normalizer / pre-tokenizer / post-processor / decoder layout that
GPT-2, Llama 3 and Qwen2 publish in their tokenizer.json, and saved through transformers' tokenizer
classes (which write tokenizer_config.json as the models' repositories hold it). SentencePiece models
(BPE and unigram, vocabulary 800, byte fallback) are trained with `sentencepiece`, and the BPE one is
converted to tokenizer.json by transformers (LlamaTokenizerFast, legacy and non-legacy layouts), as the
Llama 2 and Mistral repositories ship it.

BERT-style WordPiece and T5-style Unigram tokenizers are trained with `tokenizers` too (see bert() and
unigram()); their trainers are not deterministic, so regenerating them (`make_fixtures.py bert_uncased
...` rewrites only the named ones) gives other, equally valid vocabularies with their own expected ids.

For each tokenizer, fixtures/<name>/expected.json holds, for the test corpus (fixtures/corpus.json; its
lines joined by newlines in fixtures/corpus.txt):
every line's ids with and without special tokens, the whole text's ids, and transformers' decode of
them (with and without skip_special_tokens).
"""
import json
import os
import shutil
import sys

import sentencepiece as spm
import tokenizers
import transformers
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")

# ------------------------------------------------------------------------------------------ corpora
TRAIN = """The quick brown fox jumps over the lazy dog. It's a beautiful day, isn't it? We'll see what they've done.
Machine learning models learn patterns from data; training them takes time, memory and patience.
In 2024 the library had 1,234 users; by 2026 it had 56,789 and the numbers kept growing: 3.14159, 2.71828.
def train(model, data):\n    for batch in data:\n        loss = model(batch)\n        loss.backward()\n    return model
for (int i = 0; i < n; ++i) { total += values[i] * weights[i]; }  // accumulate
#include <vector>\nstd::vector<float> x(1024, 0.0f);\nif (x.size() != 1024 || x[0] >= 1.0f) return -1;
Le cœur a ses raisons que la raison ne connaît point. Où est la bibliothèque ? Très bien, merci !
Die Straße ist naß und die Bäume sind grün. Größere Fenster öffnen sich über dem Fluß.
¿Dónde está la estación? El niño comió manzanas y naranjas en el jardín.
Привет, как дела? Мы изучаем машинное обучение и большие языковые модели.
Καλημέρα σας, πώς είστε; Η γλώσσα είναι όμορφη.
我们在学习机器学习。今天天气很好，我们去公园散步吧。中文分词是一个有趣的问题。
東京は日本の首都です。私は毎朝コーヒーを飲みます。ひらがなとカタカナと漢字。
서울은 한국의 수도입니다. 안녕하세요, 만나서 반갑습니다.
مرحبا بكم في عالم الذكاء الاصطناعي. اللغة العربية جميلة جدا.
नमस्ते, आप कैसे हैं? मशीन लर्निंग बहुत रोचक है।
שלום לכולם, מה שלומכם היום?
Emoji time 😀😃😄 🔥🔥 👍 ❤️ 🎉 🚀 and a family 👨‍👩‍👧 on vacation 🏖️.
URLs like https://example.org/docs?page=2&lang=en#intro and emails like someone@example.com appear too.
Tabs\tseparate\tcolumns\tin\tTSV files, and    several   spaces  align  text.
    Indented code blocks use four spaces; some use\ttabs instead.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 10000 123456789 0.5 -42 +7 1e-5 3/4 50%
Don't stop, WON'T stop, I'm sure you'd agree, THEY'LL come, she's here, I'VE seen it.
"""

CORPUS_LINES = [
    "Hello world! I'M here, you're THERE, we'll see. It's 'quoted' text.",
    "DON'T WON'T I'Ll 'S 'sss 'Re",
    "  two leading spaces and three trailing   ",
    "\ttabs\tand\t\ttwo tabs\t",
    "multiple     spaces    between     words",
    "windows line ending\r",
    "Numbers 1234567890 3.14159 1,000,000 12th 2026-01-15 ٣٤٥ ²³",
    "Le cœur a ses raisons que la raison ne connaît point. Ça va? À bientôt, élève!",
    "Größenwahnsinn über die Straße; Fräulein Müller ißt Äpfel.",
    "decomposed: e\u0301cole cafe\u0301 A\u030a n\u0303 \u1100\u1161\u11a8 and composed: école café Å ñ 각",
    "¿Dónde está el niño? ¡Olé!",
    "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "Καλημέρα κόσμε, ΣΊΣΥΦΟΣ",
    "我们在北京吃烤鸭。机器学习是人工智能的一个分支。",
    "東京は日本の首都です。ひらがなとカタカナ、漢字。ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３",
    "안녕하세요 세계",
    "مرحبا بالعالم، كيف حالك؟ ١٢٣",
    "שלום עולם",
    "नमस्ते दुनिया",
    "สวัสดีชาวโลก",
    "I ❤️ kiln 🔥🔥 👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 🇫🇷🇯🇵 😀😃 🧑🏿‍💻",
    "def f(x):",
    "    return x**2 + 1  # square",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "std::vector<int32_t> v{1, 2, 3}; if (x != y && z >= 0 || !w) return;",
    "https://example.com/path?query=1&b=2#frag user@example.org",
    "<|endoftext|>The end.<|endoftext|> and again <|endoftext|>",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>",
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>",
    "a <|mask|> lstrip   <|mask|>x and kilnfire alone, xkilnfire glued, kilnfire!",
    "<s> sentencepiece control </s> <unk> pieces",
    "non\u00a0breaking\u3000ideographic\u2009thin\u200bzero-width\u202fnarrow",
    "Mongolian\u180evowel separator and\u0085next line",
    "Pneumonoultramicroscopicsilicovolcanoconiosis",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa !!!!!!!!!!!!!! ============ ____",
    "Z\u0324\u0354\u0367\u0311\u0313a\u0308\u0356\u032d\u0308\u0307lgo \ufb01 \u2126 \u212b \u00bd",
    "",
    "trailing newlines\n\n\n",
    "\n\n  \n\t\n",
    "mixed\n  indentation\n\tand \n newlines",
]


# ------------------------------------------------------------------------------------------ tokenizers
GPT2_REGEX = None  # GPT-2's ByteLevel(use_regex=True) pattern is built into the pre-tokenizer
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
VOCAB = 800
UNIGRAM_VOCAB = 500


def train_bpe(tok):
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    lines = TRAIN.replace("\\n", "\n").replace("\\t", "\t").splitlines(keepends=True)
    tok.train_from_iterator(lines * 3, trainer)
    return tok


def gpt2():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok.post_processor = processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True)
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    train_bpe(tok)
    tok.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    # an lstrip special token (as RoBERTa's <mask>): it takes the spaces before it
    tok.add_special_tokens([AddedToken("<|mask|>", special=True, lstrip=True, normalized=False)])
    fast = transformers.GPT2TokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                          unk_token="<|endoftext|>", model_max_length=1024)
    return fast


def llama3():
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False)])
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    train_bpe(tok)
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    # a non-special added token matched on the normalized text, only as a whole word
    tok.add_tokens([AddedToken("kilnfire", single_word=True, normalized=True, special=False)])
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(add_prefix_space=True, trim_offsets=False, use_regex=True),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
                                      special_tokens=[("<|begin_of_text|>", bos)])])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>",
                                                clean_up_tokenization_spaces=True, model_max_length=131072)


def qwen2():
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    train_bpe(tok)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]])
    return transformers.Qwen2TokenizerFast(tokenizer_object=tok, bos_token=None, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                           unk_token=None, clean_up_tokenization_spaces=False)


def sentencepiece_model(model_type, path_prefix):
    text = TRAIN.replace("\\n", "\n").replace("\\t", "\t").splitlines()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(text * 3), model_prefix=path_prefix, vocab_size=800 if model_type == "bpe" else 640, model_type=model_type,
                                   byte_fallback=True, character_coverage=0.98, num_threads=1, minloglevel=2,
                                   # as Llama 2 trained its tokenizer: no normalization, digits apart, runs of spaces kept
                                   normalization_rule_name="identity", remove_extra_whitespaces=False, split_digits=True,
                                   allow_whitespace_only_pieces=True,
                                   bos_id=1, eos_id=2, unk_id=0, pad_id=-1)
    os.remove(path_prefix + ".vocab")
    return path_prefix + ".model"


def convert_sp_bpe(model, legacy):
    """transformers' LlamaConverter (convert_slow_tokenizer.py), without the protobuf it needs to read the
    model: the same vocabulary, merges, normalizer / pre-tokenizer and decoder."""
    from transformers.convert_slow_tokenizer import SentencePieceExtractor
    sp = spm.SentencePieceProcessor(model_file=model)
    vocab_scores = [(sp.id_to_piece(i), 0.0 if i < 3 else sp.get_score(i)) for i in range(sp.get_piece_size())]
    _, merges = SentencePieceExtractor(model).extract(vocab_scores)
    bpe_vocab = {w: i for i, (w, _) in enumerate(vocab_scores)}
    tok = Tokenizer(models.BPE(bpe_vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True, dropout=None))
    tok.add_tokens([AddedToken(sp.id_to_piece(i), normalized=False, special=True) for i in range(sp.get_piece_size()) if sp.is_control(i)])
    if legacy:  # Llama 2's tokenizer.json
        tok.normalizer = normalizers.Sequence([normalizers.Prepend(prepend="\u2581"), normalizers.Replace(pattern=" ", content="\u2581")])
    else:  # transformers' legacy=False layout (Mistral's later files)
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1)])
    return tok


def train_lines():
    return TRAIN.replace("\\n", "\n").replace("\\t", "\t").splitlines(keepends=True) * 3


def bert(lowercase):
    """BERT's layout (transformers' BertConverter): BertNormalizer, BertPreTokenizer, WordPiece with ##,
    [CLS] $A [SEP] and the WordPiece decoder. Uncased: lower case and accents stripped, TemplateProcessing
    as BertConverter writes it; cased: neither, no CJK spacing, BertProcessing, words of at most 20
    characters (longer ones are [UNK])."""
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100 if lowercase else 20))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=lowercase, strip_accents=None if lowercase else False,
                                                lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    trainer = trainers.WordPieceTrainer(vocab_size=VOCAB, special_tokens=specials, continuing_subword_prefix="##", show_progress=False)
    tok.train_from_iterator(train_lines(), trainer)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    if lowercase:
        tok.post_processor = processors.TemplateProcessing(single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
                                                           special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    else:
        tok.post_processor = processors.BertProcessing(("[SEP]", sep), ("[CLS]", cls))
    return transformers.BertTokenizerFast(tokenizer_object=tok, do_lower_case=lowercase, strip_accents=None if lowercase else False,
                                          tokenize_chinese_chars=lowercase, unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]",
                                          cls_token="[CLS]", mask_token="[MASK]")


def unigram(byte_fallback):
    """A Unigram model trained by `tokenizers`. Without byte fallback, T5's layout (transformers'
    T5Converter, with the Nmt + NFKC normalizers of tokenizers' SentencePieceUnigramTokenizer in place of
    the precompiled charsmap): runs of spaces to one, Metaspace, "$A </s>", unknown characters fused into
    <unk>. With byte fallback (the <0xXX> pieces added), Llama's layout: no normalizer, Metaspace with
    prepend_scheme first and no split, "<s> $A", and the Replace / ByteFallback / Fuse / Strip decoders."""
    tok = Tokenizer(models.Unigram())
    if not byte_fallback:
        tok.normalizer = normalizers.Sequence([normalizers.Nmt(), normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
        tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(content=" ", left=1)])
    specials = ["<pad>", "</s>", "<unk>"] if not byte_fallback else ["<unk>", "<s>", "</s>"]
    trainer = trainers.UnigramTrainer(vocab_size=UNIGRAM_VOCAB, special_tokens=specials, unk_token="<unk>", show_progress=False)
    tok.train_from_iterator(train_lines(), trainer)
    if byte_fallback:
        j = json.loads(tok.to_str())
        low = min(score for _, score in j["model"]["vocab"])
        j["model"]["vocab"] += [[f"<0x{b:02X}>", low - 1.0] for b in range(256)]
        j["model"]["byte_fallback"] = True
        tok = Tokenizer.from_str(json.dumps(j))
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    if not byte_fallback:
        eos = tok.token_to_id("</s>")
        tok.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", eos)])
        return transformers.T5TokenizerFast(tokenizer_object=tok, extra_ids=0, eos_token="</s>", unk_token="<unk>", pad_token="<pad>")
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                                clean_up_tokenization_spaces=False)


def precompiled_charsmap():
    """The precompiled_charsmap of a SentencePiece model trained with its default rule (nmt_nfkc), read
    from the model's protobuf by hand (transformers' converters need the protobuf package; the wire format
    is enough): ModelProto field 3 (normalizer_spec), its field 2 (precompiled_charsmap)."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        prefix = os.path.join(tmp, "nfkc")
        text = TRAIN.replace("\\n", "\n").replace("\\t", "\t").splitlines()
        spm.SentencePieceTrainer.train(sentence_iterator=iter(text * 3), model_prefix=prefix, vocab_size=400, model_type="unigram",
                                       character_coverage=0.98, num_threads=1, minloglevel=2)
        with open(prefix + ".model", "rb") as f:
            data = f.read()

    def fields(buf):
        i = 0
        while i < len(buf):
            key, i = varint(buf, i)
            num, wire = key >> 3, key & 7
            if wire == 0:
                _, i = varint(buf, i)
            elif wire == 1:
                i += 8
            elif wire == 5:
                i += 4
            elif wire == 2:
                n, i = varint(buf, i)
                yield num, buf[i:i + n]
                i += n
            else:
                raise ValueError(f"wire type {wire}")

    def varint(buf, i):
        v = shift = 0
        while True:
            b = buf[i]
            i += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return v, i

    spec = next(v for n, v in fields(data) if n == 3)
    return next(v for n, v in fields(spec) if n == 2)


def unigram_precompiled():
    """T5's layout as transformers' T5Converter writes it: the Precompiled charsmap (nmt_nfkc) and runs of
    spaces to one, on the Unigram model of unigram_t5."""
    fast = unigram(False)
    tok = fast.backend_tokenizer
    tok.normalizer = normalizers.Sequence([normalizers.Precompiled(precompiled_charsmap()), normalizers.Replace(Regex(" {2,}"), " ")])
    return transformers.T5TokenizerFast(tokenizer_object=tok, extra_ids=0, eos_token="</s>", unk_token="<unk>", pad_token="<pad>")


# ------------------------------------------------------------------------------------------ expected values
def expected(tok, lines):
    whole = "\n".join(lines)
    ids_whole = tok(whole)["input_ids"]
    out = {
        "lines": [tok(line)["input_ids"] for line in lines],
        "lines_no_special": [tok(line, add_special_tokens=False)["input_ids"] for line in lines],
        "whole": ids_whole,
        "decode_whole": tok.decode(ids_whole),
        "decode_whole_skip": tok.decode(ids_whole, skip_special_tokens=True),
        "decode_lines": [tok.decode(tok(line, add_special_tokens=False)["input_ids"]) for line in lines],
        "vocab_size": len(tok),
        "bos_id": tok.bos_token_id,
        "eos_id": tok.eos_token_id,
    }
    return out


def write_expected(name, data):
    with open(os.path.join(OUT, name, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


def strings_merges(path):
    """Rewrites tokenizer.json's merges in the "a b" string form (GPT-2's original file has it)."""
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    j["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in j["model"]["merges"]]
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, indent=2)


FAST = [("gpt2", gpt2), ("llama3", llama3), ("qwen2", qwen2), ("bert_uncased", lambda: bert(True)), ("bert_cased", lambda: bert(False)),
        ("unigram_t5", lambda: unigram(False)), ("unigram_bytes", lambda: unigram(True)), ("unigram_precompiled", unigram_precompiled)]


def main():
    # `make_fixtures.py NAME...` rewrites only those tokenizers.json fixtures (the others stay byte for byte)
    only = sys.argv[1:]
    if only:
        for name in only:
            assert name in dict(FAST), f"{name} is not one of {[n for n, _ in FAST]}"
        with open(os.path.join(OUT, "corpus.json"), encoding="utf-8") as f:
            assert json.load(f) == CORPUS_LINES, "the corpus changed: regenerate everything"
        write_fast([(n, m) for n, m in FAST if n in only], CORPUS_LINES)
        return 0
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    # the test corpus: its lines (some hold newlines), and the whole text (the lines joined by newlines)
    with open(os.path.join(OUT, "corpus.json"), "w", encoding="utf-8") as f:
        json.dump(CORPUS_LINES, f, ensure_ascii=False, indent=0)
        f.write("\n")
    with open(os.path.join(OUT, "corpus.txt"), "w", encoding="utf-8", newline="") as f:
        f.write("\n".join(CORPUS_LINES))
    lines = CORPUS_LINES

    write_fast(FAST, lines)
    write_sentencepiece(lines)

    # the fixtures' versions
    with open(os.path.join(OUT, "versions.json"), "w") as f:
        json.dump({"tokenizers": tokenizers.__version__, "transformers": transformers.__version__, "sentencepiece": spm.__version__}, f)
        f.write("\n")
    total = sum(os.path.getsize(os.path.join(r, n)) for r, _, ns in os.walk(OUT) for n in ns)
    print(f"wrote {OUT}: {total / 1024:.0f} KiB")


def write_fast(makers, lines):
    for name, make in makers:
        d = os.path.join(OUT, name)
        fast = make()
        fast.save_pretrained(d)
        for extra in ["special_tokens_map.json", "vocab.json", "merges.txt", "added_tokens.json", "vocab.txt"]:
            if os.path.exists(os.path.join(d, extra)):
                os.remove(os.path.join(d, extra))
        if name == "gpt2":
            strings_merges(os.path.join(d, "tokenizer.json"))
        reloaded = transformers.AutoTokenizer.from_pretrained(d)
        assert type(reloaded).__name__.endswith("Fast"), type(reloaded)
        # the raw `tokenizers` library agrees with transformers on these (no tokenizer_config rule changes ids)
        raw = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        for line in lines:
            assert raw.encode(line).ids == reloaded(line)["input_ids"], (name, line)
        write_expected(name, expected(reloaded, lines))


def write_sentencepiece(lines):
    # SentencePiece: tokenizer.model read by libsentencepiece; ids = [bos] + sp.encode(text) (LlamaTokenizer)
    tmp = os.path.join(OUT, "tmp")
    os.makedirs(tmp)
    for name, model_type in [("sp_bpe", "bpe"), ("sp_unigram", "unigram")]:
        d = os.path.join(OUT, name)
        model = sentencepiece_model(model_type, os.path.join(tmp, name))
        slow = transformers.LlamaTokenizer(vocab_file=model, legacy=True, add_bos_token=True, add_eos_token=False)
        slow.save_pretrained(d)
        for extra in ["special_tokens_map.json", "added_tokens.json"]:
            if os.path.exists(os.path.join(d, extra)):
                os.remove(os.path.join(d, extra))
        sp = spm.SentencePieceProcessor(model_file=os.path.join(d, "tokenizer.model"))
        whole = "\n".join(lines)
        ex = {
            "lines": [[sp.bos_id()] + sp.encode(line) for line in lines],
            "lines_no_special": [sp.encode(line) for line in lines],
            "whole": [sp.bos_id()] + sp.encode(whole),
            "decode_lines": [slow.decode(sp.encode(line)) for line in lines],
            "vocab_size": sp.get_piece_size(),
            "bos_id": sp.bos_id(),
            "eos_id": sp.eos_id(),
        }
        ex["decode_whole"] = slow.decode(ex["whole"])
        ex["decode_whole_skip"] = slow.decode(ex["whole"], skip_special_tokens=True)
        # transformers' LlamaTokenizer gives the same ids where the text names no special token
        for line, ids in zip(lines, ex["lines"]):
            if not any(s in line for s in ["<s>", "</s>", "<unk>"]):
                assert slow(line)["input_ids"] == ids, (name, line, slow(line)["input_ids"], ids)
        write_expected(name, ex)

        if model_type == "bpe":
            # converted to tokenizer.json, as Llama 2 (legacy: Prepend + Replace normalizer) and Mistral
            # (Metaspace pre-tokenizer) ship it
            for jname, legacy in [("sp_llama2_json", True), ("sp_metaspace_json", False)]:
                dj = os.path.join(OUT, jname)
                fast = transformers.LlamaTokenizerFast(tokenizer_object=convert_sp_bpe(model, legacy), legacy=legacy,
                                                       add_bos_token=True, add_eos_token=False, bos_token="<s>", eos_token="</s>",
                                                       unk_token="<unk>")
                fast.save_pretrained(dj)
                for extra in ["special_tokens_map.json", "tokenizer.model"]:
                    if os.path.exists(os.path.join(dj, extra)):
                        os.remove(os.path.join(dj, extra))
                reloaded = transformers.AutoTokenizer.from_pretrained(dj)
                assert type(reloaded).__name__ == "LlamaTokenizerFast", type(reloaded)
                write_expected(jname, expected(reloaded, lines))
    shutil.rmtree(tmp)


if __name__ == "__main__":
    sys.exit(main())
